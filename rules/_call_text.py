"""Source text for a rewritten call that keeps the indentation of its continuation lines.

libcst renders a node detached from its block, so the lines of a call that spans several lines lose the
indentation of the block around it. Re-indent them like the original; if that does not reproduce the
original text, give up (None) rather than produce a misindented fix.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst


def call_text(ctx, old: cst.CSTNode, new: cst.CSTNode) -> Optional[str]:
    old_text, new_text = ctx.code(old), ctx.code(new)
    if "\n" not in old_text and "\n" not in new_text:
        return new_text
    row = ctx.line(old)
    line = ctx.source.splitlines()[row - 1] if row - 1 < len(ctx.source.splitlines()) else ""
    base = line[: len(line) - len(line.lstrip())]

    def indent(text: str) -> str:
        first, *rest = text.split("\n")
        return "\n".join([first] + [base + ln if ln.strip() else ln for ln in rest])

    if indent(old_text) not in ctx.source:
        return None
    return indent(new_text)
