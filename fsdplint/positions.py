"""Positions for the few nodes a run reports, from one cheap codegen pass.

libcst's PositionProvider costs ~2.7x the parse because it splits every token
on newlines. The codegen reproduces the source exactly, so counting characters
and mapping offsets to lines afterwards gives the same answer for less.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable

import libcst as cst
from libcst._nodes.internal import CodegenState

from fsdplint.findings import Position


@dataclass
class _OffsetState(CodegenState):
    wanted: "frozenset | None" = frozenset()  # None: every node
    offset: int = 0
    stack: list = field(default_factory=list)
    ranges: dict = field(default_factory=dict)
    indents: dict = field(default_factory=dict)

    def add_indent_tokens(self) -> None:
        for tok in self.indent_tokens:
            self.offset += len(tok)

    def add_token(self, value: str) -> None:
        self.offset += len(value)

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
        if self.wanted is None or id(node) in self.wanted:
            self.indents[id(node)] = self.current_indent

    def after_codegen(self, node) -> None:
        start = self.stack.pop()
        if self.wanted is None or id(node) in self.wanted:
            self.ranges[id(node)] = (start, self.offset)


def line_starts(source: str) -> list[int]:
    """Offsets where each line starts (\n, \r\n and lone \r end a line, as in Python)."""
    starts = [0]
    for i, ch in enumerate(source):
        if ch == "\n":
            starts.append(i + 1)
        elif ch == "\r" and (i + 1 >= len(source) or source[i + 1] != "\n"):
            starts.append(i + 1)
    return starts


class Positions:
    """Offsets → (row, 1-based column) for a set of nodes of `module` (whose code is `source`)."""

    def __init__(self, module: cst.Module, source: str, nodes: "Iterable[cst.CSTNode] | None") -> None:
        self.source = source
        self.line_starts = line_starts(source)
        state = _OffsetState(
            default_indent=module.default_indent,
            default_newline=module.default_newline,
            wanted=None if nodes is None else frozenset(id(n) for n in nodes),
        )
        module._codegen(state)
        self.ranges: dict[int, tuple[int, int]] = state.ranges
        self._indents = state.indents
        self._module = module

    def render(self, old: cst.CSTNode, new: cst.CSTNode) -> str:
        """Code for `new` as it would read in place of `old`: continuation lines keep the
        indentation of the block around `old` (libcst renders a detached node without it)."""
        state = CodegenState(
            default_indent=self._module.default_indent,
            default_newline=self._module.default_newline,
            indent_tokens=list(self._indents.get(id(old), [])),
        )
        new._codegen(state)
        return "".join(state.tokens)

    def span(self, node: cst.CSTNode) -> tuple[int, int]:
        """Offsets of the node's text without surrounding whitespace/comments lines."""
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
