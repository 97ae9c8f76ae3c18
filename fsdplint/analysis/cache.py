"""The on-disk cache of fact sheets, keyed by file content hash (like ruff's `.ruff_cache`).

One JSON file per entry under `<cache dir>/<fsdplint version>/sheets/`; writes go to a temporary file
that is renamed into place, so concurrent runs never read a half-written entry, and an entry that does
not load (corrupt, truncated, another format) is treated as a miss and rewritten.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Optional

import fsdplint

CACHE_DIR_NAME = ".fsdplint_cache"


class SheetCache:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._ok = True

    @classmethod
    def open(cls, root: Path, cache_dir: Optional[str] = None) -> "SheetCache":
        base = Path(cache_dir) if cache_dir else Path(os.environ.get("FSDPLINT_CACHE_DIR") or root / CACHE_DIR_NAME)
        return cls(base / fsdplint.__version__ / "sheets")

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> Optional[dict]:
        try:
            data = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def put(self, key: str, value: dict) -> None:
        if not self._ok:
            return
        path = self._path(key)
        try:
            if not path.parent.is_dir():
                self._init_root()
                path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(value, separators=(",", ":")))
        except OSError:
            self._ok = False  # a read-only tree: lint on without the cache

    def _init_root(self) -> None:
        """As ruff: the cache directory ignores itself in git and is tagged as a cache."""
        root = self.dir.parent.parent
        root.mkdir(parents=True, exist_ok=True)
        for name, text in ((".gitignore", "# Automatically created by fsdplint.\n*\n"),
                           ("CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n")):
            p = root / name
            if not p.exists():
                try:
                    p.write_text(text)
                except OSError:
                    pass


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename, so that a concurrent reader sees the old
    entry or the new one, never half of one (raises OSError)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
