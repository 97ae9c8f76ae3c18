"""Positions for the few nodes a run reports, from cheap codegen passes.

libcst's PositionProvider costs ~2.7x the parse because it splits every token
on newlines and renders the whole module. The codegen reproduces the source
exactly, so counting characters and mapping offsets to lines afterwards gives
the same answer for less, and only the statements that hold a finding are rendered.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

import libcst as cst
from libcst._nodes.internal import CodegenState

from fsdplint.findings import Position


@dataclass
class _OffsetState(CodegenState):
    offset: int = 0
    stack: list = field(default_factory=list)
    ranges: dict = field(default_factory=dict)
    indents: dict = field(default_factory=dict)

    keep_text: "list | None" = None  # the rendered text too, to find a statement in the source

    def add_indent_tokens(self) -> None:
        for tok in self.indent_tokens:
            self.offset += len(tok)
            if self.keep_text is not None:
                self.keep_text.append(tok)

    def add_token(self, value: str) -> None:
        self.offset += len(value)
        if self.keep_text is not None:
            self.keep_text.append(value)

    def pop_trailing_newline(self) -> None:
        pass

    current_indent: tuple = ()

    def increase_indent(self, value: str) -> None:
        super().increase_indent(value)
        self.current_indent = tuple(self.indent_tokens)

    def decrease_indent(self) -> None:
        super().decrease_indent()
        self.current_indent = tuple(self.indent_tokens)

    def before_codegen(self, node) -> None:
        self.stack.append(self.offset)
        self.indents[id(node)] = self.current_indent

    def after_codegen(self, node) -> None:
        start = self.stack.pop()
        self.ranges[id(node)] = (start, self.offset)


_NEWLINE = re.compile(r"\r\n|\r|\n")


def line_starts(source: str) -> list[int]:
    """Offsets where each line starts (\n, \r\n and lone \r end a line, as in Python)."""
    return [0, *(m.end() for m in _NEWLINE.finditer(source))]


class Positions:
    """Offsets → (row, 1-based column) for nodes of `module` (whose code is `source`), on demand.

    With `top` (node id → the innermost function or top-level statement holding it, from the
    collector) only the units that hold a requested node are rendered; each one is located in
    the source by its text, which must occur exactly once. Anything else falls back to one pass
    over the whole module."""

    def __init__(self, module: cst.Module, source: str, top: "dict[int, tuple] | None" = None) -> None:
        self.source = source
        self.line_starts = line_starts(source)
        self.ranges: dict[int, tuple[int, int]] = {}
        self._indents: dict = {}
        self._module = module
        self._top = top
        self._done: set = set()
        self._full = False

    def _state(self) -> _OffsetState:
        return _OffsetState(default_indent=self._module.default_indent, default_newline=self._module.default_newline)

    def _ensure(self, node: cst.CSTNode) -> None:
        if id(node) in self.ranges or self._full:
            return
        unit = self._top.get(id(node)) if self._top is not None else None
        if unit is None or unit in self._done:
            return self._whole()
        if unit[0] == "top":
            ok = unit[1] < len(self._module.body) and self._render(self._module.body[unit[1]], ())
        else:
            fn, indent, i = unit
            ok = self._render(fn, indent) or (i < len(self._module.body) and self._render(self._module.body[i], ()))
        self._done.add(unit)
        if not ok or id(node) not in self.ranges:
            self._whole()

    def _render(self, unit: cst.CSTNode, indent: tuple) -> bool:
        """Render one statement alone (at its block's indentation) and find it in the source;
        False unless its text occurs exactly once."""
        state = self._state()
        state.indent_tokens = list(indent)
        state.current_indent = tuple(indent)
        state.keep_text = []
        unit._codegen(state)
        text = "".join(state.keep_text)
        at = self.source.find(text)
        if not text or at < 0 or self.source.find(text, at + 1) >= 0:
            return False
        for k, (a, b) in state.ranges.items():
            self.ranges[k] = (a + at, b + at)
        self._indents.update(state.indents)
        return True

    def _whole(self) -> None:
        state = self._state()
        self._module._codegen(state)
        self.ranges = state.ranges
        self._indents = state.indents
        self._full = True

    def render(self, old: cst.CSTNode, new: cst.CSTNode) -> str:
        """Code for `new` as it would read in place of `old`: continuation lines keep the
        indentation of the block around `old` (libcst renders a detached node without it)."""
        self._ensure(old)
        state = CodegenState(
            default_indent=self._module.default_indent,
            default_newline=self._module.default_newline,
            indent_tokens=list(self._indents.get(id(old), [])),
        )
        new._codegen(state)
        return "".join(state.tokens)

    def span(self, node: cst.CSTNode) -> tuple[int, int]:
        """Offsets of the node's text without surrounding whitespace/comments lines."""
        self._ensure(node)
        start, end = self.ranges[id(node)]
        src = self.source
        if isinstance(node, cst.BaseStatement) or isinstance(node, cst.BaseSmallStatement):
            # leading blank/comment lines belong to the statement node: skip them
            while start < end:
                line_end = src.find("\n", start, end)
                line = src[start: line_end if line_end != -1 else end]
                stripped = line.strip()
                if stripped and not stripped.startswith("#"):
                    break
                if line_end == -1:
                    break
                start = line_end + 1
        while start < end and src[start] in " \t\r\n\\":
            start += 1
        while end > start and src[end - 1] in " \t\r\n":
            end -= 1
        return start, end

    def position(self, offset: int) -> Position:
        row = bisect.bisect_right(self.line_starts, offset)
        return Position(row, offset - self.line_starts[row - 1] + 1)

    def range(self, node: cst.CSTNode) -> tuple[Position, Position]:
        s, e = self.span(node)
        return self.position(s), self.position(e)

    def line_text(self, row: int) -> str:
        start = self.line_starts[row - 1]
        end = self.line_starts[row] if row < len(self.line_starts) else len(self.source)
        return self.source[start:end].rstrip("\r\n")

    def line_start(self, row: int) -> int:
        return self.line_starts[row - 1]

    def line_end_with_newline(self, row: int) -> int:
        return self.line_starts[row] if row < len(self.line_starts) else len(self.source)
