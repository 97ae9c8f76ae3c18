"""Warm versus cold on one tree, as ratios measured in one run: the findings cache's effect.

Each round, interleaved so that a change of machine load hits every command alike:
  parse-only  `python bench/parse_only.py TREE` (libcst's parse of every file, the floor)
  cold        `fsdplint check TREE -j 1` with an empty cache directory (fact sheets and findings computed)
  warm        the same command again on the cache the cold run filled (nothing changed in between)
and once, outside the rounds: the findings of `--no-cache`, cold and warm are compared byte for byte.

Usage: python bench/warm_cold.py TREE [--rounds 3] [--jobs 1] [--checkout DIR]
TREE is a local copy of a repository (e.g. `git archive HEAD | tar -x -C DIR`); nothing is downloaded.
CPU time (user + system of the process and its reaped workers) is reported with the wall time, and the
1-minute load average of each round: on a shared machine the CPU ratio is the one to read.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _timed(cmd: list[str], cwd: Path, env: dict | None = None) -> tuple[float, float, bytes]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {out.returncode}")
    return wall, cpu, out.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--checkout", type=Path, default=HERE.parent,
                    help="the fsdplint source tree measured (default: the one this script belongs to)")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(args.checkout.resolve()),
                                                                      os.environ.get("PYTHONPATH")]))}
    tree = args.tree.resolve()
    py = sys.executable
    lint = [py, "-m", "fsdplint", "check", ".", "--jobs", str(args.jobs), "--isolated", "--exit-zero",
            "--output-format", "json"]
    parse = [py, str(HERE / "parse_only.py"), "."]
    scratch = Path(tempfile.mkdtemp(prefix="fsdplint-warm-cold-"))
    try:
        plain = _timed(lint + ["--no-cache"], tree, env)[2]  # also the warm-up (bytecode, page cache)
        _timed(parse, tree)
        rows = []
        for r in range(args.rounds):
            cache = scratch / f"cache-{r}"
            load = os.getloadavg()[0]
            p = _timed(parse, tree)
            cold = _timed(lint + ["--cache-dir", str(cache)], tree, env)
            warm = _timed(lint + ["--cache-dir", str(cache)], tree, env)
            same = cold[2] == plain and warm[2] == plain
            rows.append((r + 1, load, p, cold, warm, same))
        files = sum(1 for _ in tree.rglob("*.py"))
        print(f"tree: {tree.name}, {files} .py files, -j {args.jobs}, {args.rounds} rounds\n")
        print("| round | load | parse-only s (CPU) | cold s (CPU) | warm s (CPU) | cold/parse CPU | warm/cold CPU |"
              " findings identical |")
        print("|---|---|---|---|---|---|---|---|")
        tot = [0.0, 0.0, 0.0]
        for n, load, p, cold, warm, same in rows:
            tot[0] += p[1]
            tot[1] += cold[1]
            tot[2] += warm[1]
            print(f"| {n} | {load:.1f} | {p[0]:.2f} ({p[1]:.2f}) | {cold[0]:.2f} ({cold[1]:.2f}) | "
                  f"{warm[0]:.2f} ({warm[1]:.2f}) | {cold[1] / p[1]:.2f}× | {warm[1] / cold[1]:.2f}× | "
                  f"{'yes' if same else 'NO'} |")
        print(f"| sum | | ({tot[0]:.2f}) | ({tot[1]:.2f}) | ({tot[2]:.2f}) | {tot[1] / tot[0]:.2f}× | "
              f"{tot[2] / tot[1]:.2f}× | {'yes' if all(r[5] for r in rows) else 'NO'} |")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
