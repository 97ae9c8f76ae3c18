"""Fix descriptions rules hand to the engine, and their conversion to text edits.

Rules describe a fix in terms of nodes (replace this call, move that
statement); the engine turns it into ruff-style text edits once positions are
known, so every output format and `--fix` share one representation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import libcst as cst

from fsdplint.findings import Applicability, Edit, Fix
from fsdplint.positions import Positions, line_starts


@dataclass(frozen=True)
class Replace:
    """Replace `node` with `text`, or with a new node rendered at `node`'s indentation."""

    node: cst.CSTNode
    text: Union[str, cst.CSTNode]


@dataclass(frozen=True)
class InsertLinesBefore:
    """Insert whole lines (already without indentation) before a statement, at its indentation."""

    stmt: cst.CSTNode
    lines: str


@dataclass(frozen=True)
class RemoveStatement:
    stmt: cst.CSTNode


@dataclass(frozen=True)
class InsertLinesAfter:
    stmt: cst.CSTNode
    lines: str


Op = Union[Replace, InsertLinesBefore, InsertLinesAfter, RemoveStatement]


@dataclass(frozen=True)
class FixSpec:
    applicability: Applicability
    message: str
    ops: tuple[Op, ...]

    def nodes(self):
        for op in self.ops:
            yield op.node if isinstance(op, Replace) else op.stmt


def safe(message: str, *ops: Op) -> FixSpec:
    return FixSpec(Applicability.SAFE, message, tuple(ops))


def unsafe(message: str, *ops: Op) -> FixSpec:
    return FixSpec(Applicability.UNSAFE, message, tuple(ops))


def to_fix(spec: FixSpec, pos: Positions, newline: str) -> Fix:
    edits = []
    for op in spec.ops:
        if isinstance(op, Replace):
            s, e = pos.span(op.node)
            text = op.text if isinstance(op.text, str) else pos.render(op.node, op.text)
            edits.append(Edit(text, pos.position(s), pos.position(e)))
        elif isinstance(op, (InsertLinesBefore, InsertLinesAfter)):
            s, e = pos.span(op.stmt)
            first = pos.position(s)
            last = pos.position(e)
            indent = pos.line_text(first.row)[: first.column - 1]
            text = "".join(indent + ln + newline if ln.strip() else newline for ln in op.lines.splitlines())
            if isinstance(op, InsertLinesBefore):
                at = pos.position(pos.line_start(first.row))
            else:
                at = pos.position(pos.line_end_with_newline(last.row))
            edits.append(Edit(text, at, at))
        elif isinstance(op, RemoveStatement):
            s, e = pos.span(op.stmt)
            first, last = pos.position(s), pos.position(e)
            edits.append(
                Edit("", pos.position(pos.line_start(first.row)), pos.position(pos.line_end_with_newline(last.row)))
            )
    return Fix(spec.applicability, spec.message, tuple(edits))


def add_keyword(call: cst.Call, name: str, value: str) -> cst.Call:
    """`call` with `name=value` appended, keeping the call's own layout."""
    new = cst.Arg(
        keyword=cst.Name(name),
        value=cst.parse_expression(value),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):
        prev = args[-2].comma if len(args) > 1 else None
        ws = prev.whitespace_after if isinstance(prev, cst.Comma) else cst.SimpleWhitespace(" ")
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=ws))
        new = new.with_changes(comma=last.comma)
    else:
        # The space before `)` belongs to the last argument: keep it after the new one.
        new = new.with_changes(whitespace_after_arg=last.whitespace_after_arg)
        args[-1] = last.with_changes(
            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")), whitespace_after_arg=cst.SimpleWhitespace("")
        )
    args.append(new)
    return call.with_changes(args=args)


def replace_keyword(call: cst.Call, name: str, value: str) -> cst.Call:
    args = [
        a.with_changes(value=cst.parse_expression(value)) if a.keyword is not None and a.keyword.value == name else a
        for a in call.args
    ]
    return call.with_changes(args=args)


def remove_keyword(call: cst.Call, name: str) -> cst.Call:
    args = [a for a in call.args if not (a.keyword is not None and a.keyword.value == name)]
    if args and len(args) < len(call.args):
        old_last = call.args[-1]
        if args[-1] is not old_last:
            args[-1] = args[-1].with_changes(comma=old_last.comma)
    return call.with_changes(args=args)


def apply_edits(source: str, edits: list[Edit]) -> str:
    """Apply non-overlapping edits (the caller has removed overlaps)."""
    starts = line_starts(source)

    def offset(p):
        return (starts[p.row - 1] if p.row - 1 < len(starts) else len(source)) + p.column - 1

    out = source
    for e in sorted(edits, key=lambda e: (offset(e.start), offset(e.end)), reverse=True):
        out = out[: offset(e.start)] + e.content + out[offset(e.end):]
    return out


def contains(tree: cst.CSTNode, node: cst.CSTNode) -> bool:
    """Whether `node` is `tree` or inside it (to find the statement of a block that holds a call)."""
    found = []

    class _Find(cst.CSTVisitor):
        def on_visit(self, n):
            if n is node:
                found.append(n)
            return not found

    tree.visit(_Find())
    return bool(found)
