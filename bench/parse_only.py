"""Baseline: read and parse every .py file under the given paths with libcst, nothing else.

This is the floor for any libcst-based linter. Usage: python parse_only.py [-j N] PATH...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    return out


def _parse(path: Path) -> int:
    import libcst

    try:
        libcst.parse_module(path.read_bytes())
    except libcst.ParserSyntaxError:
        return 1
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-j", "--jobs", type=int, default=1)
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args()
    files = _files(args.paths)
    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs) as pool:
            errors = sum(pool.map(_parse, files, chunksize=4))
    else:
        errors = sum(map(_parse, files))
    print(f"parsed {len(files)} files, {errors} syntax errors")
    sys.exit(0)


if __name__ == "__main__":
    main()
