"""Pieces shared by the human-readable formats (concise, full)."""

from __future__ import annotations

from collections import Counter
from typing import Sequence, TextIO

from fsdplint.findings import Applicability, Finding, Severity

_RESET = "\x1b[0m"
_BOLD = "\x1b[1m"
_DIM = "\x1b[2m"
_SEVERITY_COLOR = {Severity.ERROR: "\x1b[31m", Severity.WARNING: "\x1b[33m", Severity.INFO: "\x1b[36m"}
_CODE_COLOR = "\x1b[1;31m"
_FIX_COLOR = "\x1b[32m"


class Paint:
    """ANSI styling that collapses to plain text when colour is off."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, text: str, style: str) -> str:
        return f"{style}{text}{_RESET}" if self.enabled and text else text

    def bold(self, text: str) -> str:
        return self(text, _BOLD)

    def dim(self, text: str) -> str:
        return self(text, _DIM)

    def code(self, text: str) -> str:
        return self(text, _CODE_COLOR)

    def severity(self, sev: Severity) -> str:
        return self(f"[{sev.value}]", _SEVERITY_COLOR[sev])

    def fix(self, text: str) -> str:
        return self(text, _FIX_COLOR)


def location(f: Finding, paint: Paint) -> str:
    cell = f"cell {f.cell}{paint.dim(':')}" if f.cell is not None else ""
    return f"{paint.bold(f.filename)}{paint.dim(':')}{cell}{f.start.row}{paint.dim(':')}{f.start.column}{paint.dim(':')}"


def headline(f: Finding, paint: Paint, short: bool = False) -> str:
    """The finding's first line; `short` (concise output): the message cut to what breaks and the fix."""
    marker = ""
    if f.fix is not None:
        marker = " " + paint.fix("[*]" if f.fix.applicability == Applicability.SAFE else "[-]")
    message = f.message
    if short:
        from fsdplint.output.short import short_message

        message = short_message(f.message, f.fix.message if f.fix is not None else None)
    return f"{location(f, paint)} {paint.code(f.code)}{marker} {paint.severity(f.severity)} {message}"


def related_lines(f: Finding, paint: Paint) -> str:
    """The other half of a finding that spans files, one indented location line each."""
    return "".join(f"    {paint.dim('=')} {paint.bold(r.filename)}{paint.dim(':')}{r.start.row}{paint.dim(':')}"
                   f"{r.start.column}{paint.dim(':')} {r.message}\n" for r in f.related)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("x") else "s")


def summary_line(findings: Sequence[Finding], summary, paint: Paint) -> str:
    """E.g. "3 errors, 1 warning in 2 files; 2 fixable with --fix"."""
    fixed = summary.fixed if summary else 0
    if not findings:
        if fixed:
            return paint.fix(f"Fixed {_plural(fixed, 'finding')}; all checks passed!")
        return paint.fix("All checks passed!")
    counts = Counter(f.severity for f in findings)
    parts = [_plural(counts[s], s.value) for s in Severity if counts[s]]
    files = len({f.filename for f in findings})
    line = f"{', '.join(parts)} in {_plural(files, 'file')}"
    if summary is not None:
        safe, unsafe = summary.fixable_safe, summary.fixable_unsafe
    else:
        safe = sum(1 for f in findings if f.fix and f.fix.applicability == Applicability.SAFE)
        unsafe = sum(1 for f in findings if f.fix and f.fix.applicability == Applicability.UNSAFE)
    extras = []
    if safe:
        extras.append(f"{safe} fixable with --fix")
    if unsafe:
        extras.append(f"{unsafe} {'more ' if safe else ''}fixable with --unsafe-fixes")
    if extras:
        line += "; " + ", ".join(extras)
    if fixed:
        line = f"Fixed {_plural(fixed, 'finding')}; remaining: {line}"
    return paint.bold(line)


def statistics_lines(findings: Sequence[Finding], paint: Paint) -> list[str]:
    """Ruff-style `--statistics`: count, code, fix marker ([*] safe, [-] unsafe), name; most frequent first."""
    counts = Counter(f.code for f in findings)
    names = {f.code: f.name for f in findings}
    safe = {f.code for f in findings if f.fix is not None and f.fix.applicability == Applicability.SAFE}
    unsafe = {f.code for f in findings if f.fix is not None} - safe
    width = max((len(str(n)) for n in counts.values()), default=1)
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [
        f"{str(n).rjust(width)}\t{paint.code(code)}\t{'[*]' if code in safe else '[-]' if code in unsafe else '[ ]'} {names[code]}"
        for code, n in rows
    ]


def fix_lines(findings: Sequence[Finding], summary, paint: Paint) -> list[str]:
    """`--show-fixes`: what each remaining fix would do (applied ones are counted in the summary)."""
    lines = []
    for f in findings:
        if f.fix is not None:
            kind = "safe" if f.fix.applicability == Applicability.SAFE else "unsafe"
            lines.append(f"{f.where}: {f.code} ({kind} fix) {f.fix.message}")
    if lines:
        lines.insert(0, paint.bold("Available fixes:"))
    return lines


def write_text(findings, out: TextIO, *, color, summary, show_fixes, statistics, render) -> None:
    paint = Paint(color)
    if statistics:
        for line in statistics_lines(findings, paint):
            out.write(line + "\n")
    else:
        for f in findings:
            out.write(render(f, paint))
    if show_fixes:
        for line in fix_lines(findings, summary, paint):
            out.write(line + "\n")
    out.write(summary_line(findings, summary, paint) + "\n")
