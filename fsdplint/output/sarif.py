"""SARIF 2.1.0, as GitHub code scanning accepts it.

`tool.driver.rules` describes the rules that have results (every registered rule with
`all_rules`, for a catalog); results carry repo-relative URIs, regions, partial fingerprints and
fixes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from urllib.parse import quote

import fsdplint
from fsdplint.findings import DOCS_URL, Severity

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def _uri(filename: str) -> str:
    """A repo-relative URI (relative to the working directory) where possible, percent-encoded as RFC 3986
    requires of a relative reference: a space, `%`, `#`, `?` or a colon in the first segment would otherwise make
    the `uri-reference` invalid and code scanning rejects the upload."""
    path = Path(filename)
    if path.is_absolute():
        try:
            path = path.relative_to(Path.cwd())
        except ValueError:
            return path.as_uri()
    return quote(Path(os.path.normpath(path)).as_posix(), safe="/")


def _rule_descriptor(rule) -> dict:
    doc = rule.full_doc() if hasattr(rule, "full_doc") else rule.summary
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": _first_section(rule.doc) or rule.summary},
        "help": {"text": f"{rule.summary}\nSee {DOCS_URL.format(code=rule.code)}", "markdown": doc},
        "helpUri": DOCS_URL.format(code=rule.code),
        "defaultConfiguration": {"level": _LEVEL[rule.severity]},
        "properties": {"tags": ["fsdp", *sorted({"S": "static", "A": "audit", "R": "runtime"}[s] for s in rule.sides)]},
    }


def _first_section(doc: str) -> str:
    """The text of the doc's first section ("What it does")."""
    lines = [ln.strip() for ln in (doc or "").strip().splitlines()]
    body, started = [], False
    for ln in lines:
        if ln.startswith("## "):
            if started:
                break
            started = True
            continue
        if started or not ln.startswith("#"):
            body.append(ln)
    return " ".join(b for b in body if b).strip()


def _descriptor_for_unknown(f) -> dict:
    return {
        "id": f.code,
        "name": f.name,
        "shortDescription": {"text": f.name},
        "fullDescription": {"text": f.name},
        "help": {"text": f"See {f.url}"},
        "helpUri": f.url,
        "defaultConfiguration": {"level": _LEVEL[f.severity]},
    }


def fingerprint(f) -> str:
    """Stable across unrelated edits: path, code and the normalised source line (as baselines)."""
    from fsdplint.baseline import normalise_line

    line = normalise_line(f)
    return hashlib.sha256(f"{_uri(f.filename)}\0{f.code}\0{line}".encode()).hexdigest()[:32]


def _region(start, end) -> dict:
    region = {"startLine": start.row, "startColumn": start.column}
    if (end.row, end.column) >= (start.row, start.column):
        region["endLine"] = end.row
        region["endColumn"] = end.column
    return region


def _result(f, index: int) -> dict:
    uri = _uri(f.filename)
    location = {"physicalLocation": {"artifactLocation": {"uri": uri}, "region": _region(f.start, f.end)}}
    if f.source_line:
        location["physicalLocation"]["region"]["snippet"] = {"text": f.source_line.rstrip("\r\n")}
    result = {
        "ruleId": f.code,
        "ruleIndex": index,
        "level": _LEVEL[f.severity],
        "message": {"text": f.message},
        "locations": [location],
        "partialFingerprints": {"fsdplint/v1": fingerprint(f)},
    }
    if f.related:
        result["relatedLocations"] = [
            {"id": i, "physicalLocation": {"artifactLocation": {"uri": _uri(r.filename)}, "region": _region(r.start, r.end)},
             "message": {"text": r.message}}
            for i, r in enumerate(f.related)
        ]
    if f.fix is not None and f.fix.edits:
        result["fixes"] = [
            {
                "description": {"text": f.fix.message},
                "artifactChanges": [
                    {
                        "artifactLocation": {"uri": uri},
                        "replacements": [
                            {
                                "deletedRegion": {
                                    "startLine": e.start.row,
                                    "startColumn": e.start.column,
                                    "endLine": e.end.row,
                                    "endColumn": e.end.column,
                                },
                                "insertedContent": {"text": e.content},
                            }
                            for e in f.fix.edits
                        ],
                    }
                ],
            }
        ]
    if f.notes:
        result["properties"] = {"notes": {str(k): str(v) for k, v in f.notes.items()}}
    return result


def build_log(findings, all_rules: bool = False) -> dict:
    from fsdplint.registry import all_rules as registered

    # Only the rules with results by default: the catalog's text would be most of the file otherwise.
    wanted = {f.code for f in findings}
    descriptors = [_rule_descriptor(r) for r in registered() if all_rules or r.code in wanted]
    index = {d["id"]: i for i, d in enumerate(descriptors)}
    for f in findings:
        if f.code not in index:
            index[f.code] = len(descriptors)
            descriptors.append(_descriptor_for_unknown(f))
    return {
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "fsdplint",
                        "version": fsdplint.__version__,
                        "semanticVersion": fsdplint.__version__,
                        "informationUri": "https://github.com/fsdplint/fsdplint",
                        "rules": descriptors,
                    }
                },
                "columnKind": "unicodeCodePoints",
                "results": [_result(f, index[f.code]) for f in findings],
            }
        ],
    }


def write(findings, out, all_rules=False, **_options) -> None:
    json.dump(build_log(findings, all_rules=all_rules), out, indent=2)
    out.write("\n")
