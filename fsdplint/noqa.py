"""`# noqa: FSDP101` on a line (bare `# noqa` = all codes) and `# fsdplint: noqa` for a file."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Optional

_NOQA = re.compile(r"#\s*noqa(?::[ \t]*(?P<codes>[A-Za-z]+[0-9]+(?:[ \t]*,?[ \t]*[A-Za-z]+[0-9]+)*))?", re.I)
_FILE_NOQA = re.compile(r"^[ \t]*#[ \t]*fsdplint[ \t]*:[ \t]*noqa[ \t]*$", re.M | re.I)


@dataclass
class NoqaDirective:
    row: int
    codes: Optional[frozenset]  # None: every code
    start: int  # offset of the comment in the source
    end: int
    used: set = field(default_factory=set)


class NoqaMap:
    def __init__(self, source: str) -> None:
        self.file_exempt = "noqa" in source and bool(_FILE_NOQA.search(source))
        self.by_row: dict[int, NoqaDirective] = {}
        if "noqa" not in source.lower():
            return
        starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", source)]
        for m in _NOQA.finditer(source):
            row = bisect.bisect_right(starts, m.start())
            codes = m.group("codes")
            parsed = frozenset(c.upper() for c in re.findall(r"[A-Za-z]+[0-9]+", codes)) if codes else None
            self.by_row[row] = NoqaDirective(row, parsed, m.start(), m.end())

    def suppresses(self, code: str, rows) -> bool:
        if self.file_exempt:
            return True
        for row in rows:
            d = self.by_row.get(row)
            if d is not None and (d.codes is None or code in d.codes):
                d.used.add(code)
                return True
        return False

    def unused(self) -> list[tuple[NoqaDirective, list[str]]]:
        """Directives naming fsdplint codes that suppressed none of them."""
        out = []
        for d in self.by_row.values():
            if d.codes is None:
                continue
            ours = sorted(c for c in d.codes if c.startswith("FSDP") and c not in d.used)
            if ours:
                out.append((d, ours))
        return out
