"""Whole repositories, cold: fsdplint against libcst's parse of the same files, as ratios measured in one run.

Per tree, in interleaved rounds (a change of machine load hits every command alike), the minimum over the rounds:
  parse-only  `python bench/parse_only.py TREE` (read and `libcst.parse_module` every .py file: the floor)
  fsdplint    `python -m fsdplint check TREE -j 1 --isolated --no-cache --output-format json` (nothing cached)
  --against   the same with another fsdplint on PYTHONPATH (e.g. `git archive BASE fsdplint rules | tar -x -C DIR`)
and once per tree, outside the rounds, with `FSDPLINT_PARSE_LOG` (fsdplint/parsing.py): the libcst parses per
module with `-j 1` and with `-j N` (`--jobs`), and whether their findings, and those of `--against`, are identical.

Usage: python bench/cold.py TREE... [--rounds 3] [--jobs 2] [--against DIR] [--checkout DIR]
A TREE is a local copy of a repository (e.g. `git archive HEAD | tar -x -C DIR`); nothing is downloaded.
CPU time is user + system of the process and its reaped workers; the 1-minute load is given per round.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _env(source: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")]))}


def _run(cmd: list[str], cwd: Path, env: dict) -> tuple[float, bytes]:
    """CPU seconds (the process and its workers) and stdout of one command."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {os.waitstatus_to_exitcode(status)}")
    return usage.ru_utime + usage.ru_stime, out


def _parses(log: Path) -> tuple[int, int, int]:
    """(parses, modules parsed, parses beyond one per module), files without a path left out."""
    per = Counter(line.split("\t", 1)[1] for line in log.read_text().splitlines() if not line.endswith("\t-"))
    return sum(per.values()), len(per), sum(n - 1 for n in per.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2, help="the -j N whose parses per module are counted")
    ap.add_argument("--against", type=Path, help="another fsdplint source tree (fsdplint/ and rules/) to compare")
    ap.add_argument("--checkout", type=Path, default=HERE.parent,
                    help="the fsdplint source tree measured (default: the one this script belongs to)")
    args = ap.parse_args()
    py = sys.executable
    own = _env(args.checkout.resolve())
    other = _env(args.against.resolve()) if args.against else None
    lint = [py, "-m", "fsdplint", "check", ".", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json"]
    parse = [py, str(HERE / "parse_only.py"), "."]
    print(f"cold runs (`--no-cache`, -j 1), {args.rounds} interleaved rounds, min CPU s (user + system)\n")
    head = "| tree | files | lines | load | parse-only CPU s | fsdplint CPU s | fsdplint / parse |"
    sep = "|---|---|---|---|---|---|---|"
    if args.against:
        head += f" {args.against.name} CPU s | {args.against.name} / parse |"
        sep += "---|---|"
    print(head + f" parses -j 1 (modules, extra) | parses -j {args.jobs} (modules, extra) | findings -j 1 = -j {args.jobs}"
          + (f" = {args.against.name}" if args.against else "") + " |")
    print(sep + "---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="fsdplint-cold-") as scratch:
        for tree in (t.resolve() for t in args.trees):
            files = [p for p in tree.rglob("*.py")]
            lines = sum(p.read_bytes().count(b"\n") for p in files)
            counts, outs = {}, {}
            for jobs in (1, args.jobs):
                log = Path(scratch) / f"{tree.name}-j{jobs}.log"
                env = {**own, "FSDPLINT_PARSE_LOG": str(log)}
                outs[jobs] = _run(lint + ["--jobs", str(jobs)], tree, env)[1]  # also the warm-up
                counts[jobs] = _parses(log) if log.exists() else (0, 0, 0)
            base_out = _run(lint + ["--jobs", "1"], tree, other)[1] if other else None
            _run(parse, tree, own)
            best: dict = {}
            loads = []
            for _ in range(args.rounds):
                loads.append(os.getloadavg()[0])
                cmds = [("parse", parse, own), ("lint", lint + ["--jobs", "1"], own)]
                if other:
                    cmds.append(("against", lint + ["--jobs", "1"], other))
                for key, cmd, env in cmds:
                    cpu = _run(cmd, tree, env)[0]
                    best[key] = min(best.get(key, cpu), cpu)
            p, lt = best["parse"], best["lint"]
            cells = [tree.name, str(len(files)), f"{lines:,}", f"{min(loads):.1f}–{max(loads):.1f}", f"{p:.2f}",
                     f"{lt:.2f}", f"{lt / p:.2f}×"]
            if args.against:
                cells += [f"{best['against']:.2f}", f"{best['against'] / p:.2f}×"]
            for jobs in (1, args.jobs):
                n, mods, extra = counts[jobs]
                cells.append(f"{n} ({mods}, {extra})")
            same = outs[1] == outs[args.jobs] and (base_out is None or base_out == outs[1])
            cells.append("yes" if same else "NO")
            print("| " + " | ".join(cells) + " |", flush=True)

if __name__ == "__main__":
    main()
