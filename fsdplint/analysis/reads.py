"""The project modules one file's lint read, noted as they are read (for the findings cache).

Kept free of imports: the index notes each module text it hands out, the findings cache collects them.
"""

from __future__ import annotations

from typing import Optional

_current: Optional[set] = None


def start() -> set:
    """Begin noting reads for one file's lint; the set fills as modules are read."""
    global _current
    _current = set()
    return _current


def stop() -> None:
    global _current
    _current = None


def note(path) -> None:
    if _current is not None:
        _current.add(path)
