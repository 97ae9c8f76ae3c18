"""`--add-noqa`: silence today's findings with `# noqa: CODE` comments (ruff's workflow).

Each comment goes on the line the finding starts on, or, when that line ends
inside a multi-line string, on the line where the string ends. Existing
`# noqa: ...` comments are extended; a bare `# noqa` already silences all.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from fsdplint.errors import UsageError
from fsdplint.findings import Finding

NOQA = re.compile(r"#\s*noqa(?::[\s]?(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)
_SUFFIXES = (".py", ".pyi")


def _string_ends(text: str) -> dict[int, int]:
    """row → the row a multi-line string token covering the end of `row` ends on."""
    ends: dict[int, int] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING or getattr(tokenize, "FSTRING_END", None) == tok.type:
                (srow, _), (erow, _) = tok.start, tok.end
                for row in range(srow, erow):
                    ends[row] = erow
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return ends


def _merge(line: str, codes: Iterable[str]) -> str:
    body = line.rstrip("\r\n")
    newline = line[len(body):]
    m = NOQA.search(body)
    if m and not m.group("codes"):
        return line  # bare `# noqa` already silences everything on the line
    if m:
        present = [c.upper() for c in re.split(r"[,\s]+", m.group("codes")) if c]
        merged = present + sorted(set(codes) - set(present))
        if merged == present:
            return line
        return body[: m.start()] + "# noqa: " + ", ".join(merged) + body[m.end():] + newline
    return body.rstrip() + "  # noqa: " + ", ".join(sorted(set(codes))) + newline


def add_noqa_to_text(text: str, rows_codes: dict[int, set[str]]) -> tuple[str, int]:
    """Returns the new text and how many lines got (or extended) a noqa comment."""
    lines = text.splitlines(keepends=True)
    ends = _string_ends(text)
    target: dict[int, set[str]] = defaultdict(set)
    for row, codes in rows_codes.items():
        row = ends.get(row, row)
        if 1 <= row <= len(lines):
            target[row] |= codes
    changed = 0
    for row, codes in target.items():
        new = _merge(lines[row - 1], codes)
        if new != lines[row - 1]:
            lines[row - 1] = new
            changed += 1
    return "".join(lines), changed


def add_noqa(findings: Iterable[Finding]) -> int:
    """Edit the files in place; returns the number of lines changed. Non-Python files are left alone."""
    by_file: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for f in findings:
        if f.filename.endswith(_SUFFIXES):
            by_file[f.filename][f.start.row].add(f.code)
    total = 0
    for filename, rows in sorted(by_file.items()):
        path = Path(filename)
        try:
            with open(path, encoding="utf-8", newline="") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"{filename}: cannot read for --add-noqa: {e}") from None
        new, changed = add_noqa_to_text(text, rows)
        if changed:
            with open(path, "w", encoding="utf-8", newline="") as fh:
                fh.write(new)
            total += changed
    return total
