"""Like `concise`, plus the offending source line with a caret under the span."""

from __future__ import annotations

from fsdplint.output.text import headline, related_lines, write_text


def _snippet(f, paint) -> str:
    line = f.source_line.rstrip("\r\n")
    if not line:
        return ""
    gutter = str(f.start.row)
    pad = " " * len(gutter)
    expanded = line.expandtabs(1)
    col = max(1, min(f.start.column, len(expanded) + 1))
    if f.end.row == f.start.row and f.end.column > f.start.column:
        width = max(1, min(f.end.column, len(expanded) + 1) - col)
    else:
        width = max(1, len(expanded.rstrip()) - col + 1)
    caret = " " * (col - 1) + "^" * width
    bar = paint.dim("|")
    text = f"{pad} {bar}\n{paint.dim(gutter)} {bar} {expanded}\n{pad} {bar} {paint.code(caret)}\n"
    if f.fix is not None:
        text += f"{pad} = {paint.fix('fix')}: {f.fix.message}\n"
    return text


def _render(f, paint) -> str:
    return f"{headline(f, paint)}\n{related_lines(f, paint)}{_snippet(f, paint)}{paint.dim('  see ' + f.url)}\n\n"


def write(findings, out, *, color=False, summary=None, show_fixes=False, statistics=False) -> None:
    write_text(findings, out, color=color, summary=summary, show_fixes=show_fixes, statistics=statistics, render=_render)
