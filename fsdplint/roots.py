"""Where a project starts: the files that mark its root, and the linted folder standing in for them.

A tree copied without its `.git` (an unpacked archive, a case extracted for a benchmark) has no marker;
linted as `fsdplint DIR`, the folder the user named is the project. Kept free of imports: the index, the
launcher search and the version lookup all use it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

ROOT_MARKERS = ("pyproject.toml", "setup.cfg", "setup.py", ".git")


def has_marker(d: Path) -> bool:
    return any((d / m).exists() for m in ROOT_MARKERS)


def find_root(path: Path) -> Optional[Path]:
    """The nearest directory above `path` holding a project marker."""
    try:
        full = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13): the file is unreadable,
        full = Path(os.path.abspath(path))  # which the lint reports; its root is looked up from where it sits
    d = full.parent if not path.is_dir() else full
    for p in (d, *d.parents):
        if has_marker(p):
            return p
    return None


def linted_root(directory: Path, linted_dir) -> Optional[Path]:
    """For a directory with no marker above it: the directory given on the command line, when it holds
    `directory` (else None)."""
    if linted_dir is None:
        return None
    base = Path(linted_dir).resolve()
    return base if directory == base or base in directory.parents else None
