"""libcst's parse of a module: the costliest step of a lint, and the one a run must do once per module.

With `FSDPLINT_PARSE_LOG=FILE` in the environment, every parse appends one line to FILE: whether the whole
module or a part was parsed (`whole`/`part`), and its path (`-` when it has none). `bench/cold.py` counts
parses per module with it, for `-j 1` and `-j N` alike (each line is one short append: lines of several
worker processes do not interleave).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import libcst as cst


def parse_module(text: str, path: Optional[Path] = None, part: bool = False) -> cst.Module:
    log = os.environ.get("FSDPLINT_PARSE_LOG")
    if log:
        _note(log, f"{'part' if part else 'whole'}\t{os.path.abspath(path) if path is not None else '-'}\n")
    return cst.parse_module(text)


def _note(log: str, line: str) -> None:
    try:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return
    try:
        os.write(fd, line.encode("utf-8", "replace"))
    finally:
        os.close(fd)
