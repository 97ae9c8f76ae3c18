"""GitHub Actions workflow commands: one `::error file=…::message` annotation per finding.

Escaping follows @actions/core (`toCommandValue` / `escapeData` / `escapeProperty`).
"""

from __future__ import annotations

from fsdplint.findings import Severity

_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def unescape_data(text: str) -> str:
    """Inverse of `escape_data` (what the runner does when it reads the command)."""
    return text.replace("%0A", "\n").replace("%0D", "\r").replace("%25", "%")


def unescape_property(text: str) -> str:
    return unescape_data(text.replace("%2C", ",").replace("%3A", ":"))


def _repo_relative(filename: str) -> str:
    # GitHub matches annotations to files by repo-relative path: drop a leading `./`.
    while filename.startswith("./") and len(filename) > 2:
        filename = filename[2:]
    return filename


def annotation(f) -> str:
    props = {
        "file": _repo_relative(f.filename),
        "line": str(f.start.row),
        "col": str(f.start.column),
        "endLine": str(f.end.row),
        "endColumn": str(f.end.column),
        "title": f"fsdplint ({f.code})",
    }
    prop_text = ",".join(f"{k}={escape_property(v)}" for k, v in props.items())
    message = f.message + "".join(f"\n{_repo_relative(r.filename)}:{r.start.row}:{r.start.column}: {r.message}"
                                  for r in f.related)
    return f"::{_LEVEL[f.severity]} {prop_text}::{escape_data(message)}"


def write(findings, out, **_options) -> None:
    for f in findings:
        out.write(annotation(f) + "\n")
