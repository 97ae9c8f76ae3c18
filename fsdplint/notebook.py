"""Jupyter notebooks (`.ipynb`) read as one program, the way the kernel runs them.

The code cells are joined in order (markdown and raw cells are not code); an IPython line magic or
`!shell` line becomes a placeholder comment, so the program parses and a fix cannot move or lose it.
A marker comment ends each cell: after `--fix`, the text between two markers is that cell's new
source, and only the `source` of changed code cells is written back; outputs, metadata and the rest
of the JSON stay as they were.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Optional

from fsdplint.source import SourceError

# The marker and placeholder are comments that no person writes, so they cannot clash with code.
_END = "# \u2063fsdplint-cell-end {n}"
_END_RE = re.compile(r"^# \u2063fsdplint-cell-end (\d+)\r?\n?$")
_MAGIC = "# \u2063fsdplint-magic {n}"
_MAGIC_RE = re.compile(r"^([ \t]*)# \u2063fsdplint-magic (\d+)$")
# `%time x`, `!pip install`, `?obj`, `obj?`, `files = !ls`, `x = %env HOME`.
_MAGIC_LINE = re.compile(r"^[ \t]*(?:[%!?]|[A-Za-z_][\w, \t]*=[ \t]*[%!])|^[^#]*[^\s#]\?\??[ \t]*$")


def is_notebook(filename: str) -> bool:
    return filename.endswith(".ipynb")


@dataclass
class Notebook:
    """A notebook's JSON and the program its code cells make."""

    raw: bytes
    data: dict
    text: str = ""
    # Joined row (1-based) → (cell number, 1-based; row in the cell, 1-based); marker rows are absent.
    rows: dict = field(default_factory=dict)
    magics: list = field(default_factory=list)
    code_cells: list = field(default_factory=list)  # indices into data["cells"], in order

    # SourceFile's interface, so the CLI writes a fixed notebook like any fixed file.
    encoding = "utf-8"
    bom = False

    def encode(self, text: str) -> bytes:
        if text == self.text:
            return self.raw
        return self.write_back(text)

    def cell_of(self, row: int) -> Optional[tuple[int, int]]:
        return self.rows.get(row)

    def write_back(self, text: str) -> bytes:
        """The notebook with each code cell's source replaced by its part of `text` (fixed)."""
        parts = _split_cells(text, len(self.code_cells))
        if parts is None:
            raise UnicodeEncodeError("utf-8", "", 0, 1, "a fix moved code across a notebook cell boundary")
        data = json.loads(self.raw.decode("utf-8"))
        for idx, part in zip(self.code_cells, parts):
            cell = data["cells"][idx]
            old = _cell_source(cell)
            new = _restore_magics(part, self.magics)
            if not old.endswith("\n") and new.endswith("\n"):
                new = new[:-1]
            if new == old:
                continue
            lines = new.splitlines(keepends=True)
            cell["source"] = lines if isinstance(cell.get("source"), list) else new
        indent = _indent_of(self.raw)
        out = json.dumps(data, indent=indent, ensure_ascii=False)
        return (out + ("\n" if self.raw.endswith(b"\n") else "")).encode("utf-8")


def _cell_source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _indent_of(raw: bytes) -> int:
    m = re.search(rb"\n( +)\"", raw)
    return len(m.group(1)) if m else 1


def read_notebook(data: bytes) -> Notebook:
    """Parse a notebook; a SourceError (one line) when it is not one."""
    try:
        nb = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise SourceError(f"the notebook is not UTF-8 (byte {e.start})", 1) from None
    except json.JSONDecodeError as e:
        raise SourceError(f"not a Jupyter notebook: invalid JSON ({e.msg} at line {e.lineno})", e.lineno) from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise SourceError("not a Jupyter notebook: no `cells` list at the top level", 1)
    lang = ((nb.get("metadata") or {}).get("language_info") or {}).get("name") or \
        ((nb.get("metadata") or {}).get("kernelspec") or {}).get("language")
    book = Notebook(raw=data, data=nb)
    if lang and str(lang).lower() != "python":
        return book  # an R or Julia notebook: no Python to read
    out: list[str] = []
    row = 1
    for idx, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = _cell_source(cell)
        lines = src.splitlines()
        if lines and lines[0].lstrip().startswith("%%"):
            lines = []  # a cell magic (%%bash, %%writefile): the cell is not Python
        book.code_cells.append(idx)
        continued = False  # the previous line was a magic ending in `\`: IPython reads this one into it
        for i, line in enumerate(lines, start=1):
            if continued or (_MAGIC_LINE.match(line) and not _is_python(line)):
                continued = line.rstrip().endswith("\\")
                indent = line[: len(line) - len(line.lstrip())]
                book.magics.append(line)
                line = indent + _MAGIC.format(n=len(book.magics) - 1)
            out.append(line + "\n")
            book.rows[row] = (idx + 1, i)
            row += 1
        out.append(_END.format(n=idx + 1) + "\n")
        row += 1
    book.text = "".join(out)
    return book


def _is_python(line: str) -> bool:
    """A line the magic pattern matched that is still valid Python (`a = b ? c` is not; `x != y` is)."""
    s = line.strip()
    if s.startswith(("%", "!", "?")) or s.endswith("?"):
        return False
    import ast

    try:
        ast.parse(s)
        return True
    except SyntaxError:
        return False


def _split_cells(text: str, n: int) -> Optional[list[str]]:
    parts, cur = [], []
    for line in text.splitlines(keepends=True):
        if _END_RE.match(line):
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(line)
    if len(parts) != n or "".join(cur).strip():
        return None
    return parts


def _restore_magics(text: str, magics: list) -> str:
    out = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        m = _MAGIC_RE.match(body)
        if m and int(m.group(2)) < len(magics):
            line = magics[int(m.group(2))] + line[len(body):]
        out.append(line)
    return "".join(out)
