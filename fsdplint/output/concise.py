"""`path:row:col: CODE [severity] what breaks. The fix.`, one finding a line, then a summary
(the whole message is in `full`)."""

from __future__ import annotations

from fsdplint.output.text import headline, related_lines, write_text


def write(findings, out, *, color=False, summary=None, show_fixes=False, statistics=False) -> None:
    write_text(
        findings, out, color=color, summary=summary, show_fixes=show_fixes, statistics=statistics,
        render=lambda f, paint: headline(f, paint, short=True) + "\n" + related_lines(f, paint),
    )
