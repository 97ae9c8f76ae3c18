"""Report formats. `write_report` is the single entry point the CLI uses.

Each format lives in its own module and is imported on demand, so the static
path only pays for the format it prints.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Sequence, TextIO

from fsdplint.findings import Finding

FORMATS = ("concise", "full", "json", "json-lines", "github", "sarif", "junit")

_MODULES = {
    "concise": "concise",
    "full": "full",
    "json": "json_format",
    "json-lines": "json_lines",
    "github": "github",
    "sarif": "sarif",
    "junit": "junit",
}


@dataclass
class RunSummary:
    """Run-level numbers the text formats print under the findings."""

    files_checked: int = 0
    # Fixes applied in this run (`--fix`).
    fixed: int = 0
    # Remaining findings whose fix `--fix` would apply / that need `--unsafe-fixes`.
    fixable_safe: int = 0
    fixable_unsafe: int = 0


def write_report(
    findings: Sequence[Finding],
    fmt: str,
    out: TextIO,
    *,
    color: bool = False,
    summary: RunSummary | None = None,
    show_fixes: bool = False,
    statistics: bool = False,
    all_rules: bool = False,
) -> None:
    """Write `findings` to `out` in format `fmt` (one of FORMATS)."""
    if fmt not in _MODULES:
        raise ValueError(f"unknown output format {fmt!r}; expected one of: {', '.join(FORMATS)}")
    module = importlib.import_module(f"fsdplint.output.{_MODULES[fmt]}")
    findings = sorted(findings, key=Finding.sort_key)
    extra = {"all_rules": all_rules} if fmt == "sarif" else {}
    module.write(findings, out, color=color, summary=summary, show_fixes=show_fixes, statistics=statistics, **extra)
