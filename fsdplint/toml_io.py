"""Reading TOML files with errors that name the file, line and column (shared by config and versions)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from fsdplint.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def read_toml(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read configuration: {e}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        where = f"{path}:{m.group(1)}:{m.group(2)}" if m else f"{path}"
        reason = re.sub(r"\s*\(at (line \d+, column \d+|end of document)\)", "", msg)
        raise UsageError(f"{where}: invalid TOML: {reason}") from None
