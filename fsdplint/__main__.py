"""The `fsdplint` console script (and `python -m fsdplint`): the CLI in a short-lived process.

Two things a one-shot linter need not pay for, as mypy also skips them: frequent cyclic
garbage collections while libcst's node classes and the parsed trees are built (they are
long-lived and seldom cyclic), and freeing every object one by one at exit.
"""

from __future__ import annotations

import gc
import os
import sys


def main() -> None:
    gc.set_threshold(100_000, 50, 100)
    from fsdplint import findings_cache

    findings_cache.install()  # every configuration read counts as a dependency of the cached findings
    from fsdplint.cli import main as cli

    try:
        cli(prog_name="fsdplint")
        code = 0
    except SystemExit as e:
        code = e.code
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # a closed pipe: nobody reads the report
        pass
    os._exit(code)


if __name__ == "__main__":
    main()
