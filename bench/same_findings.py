"""Whether a change to fsdplint left its findings as they were: this checkout's JSON report of each tree,
byte for byte, against another revision's and across the ways of running it.

Per tree, for this checkout, the report of
  -j 1 --no-cache, -j 2 --no-cache,
  -j 1 with a cache (an empty cache directory: the run that fills it), -j 1 with that cache (every file a hit),
  -j 2 with that cache;
and `--against`'s (another fsdplint source tree, e.g. `git archive main fsdplint rules | tar -x -C DIR`)
`-j 1 --no-cache` report (all five with `--all-modes`): each must equal this checkout's `-j 1 --no-cache`. The cache directories are temporary, one per
revision (never inside the tree, so the tree is left as it was). Exit status 1 when any report differs;
the differing reports are kept with `--keep DIR` to compare them.

Usage: python bench/same_findings.py TREE... [--against DIR [--all-modes]] [--jobs 2] [--keep DIR]
Not a timed test: it checks behaviour and takes several minutes per repository.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _env(source: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")]))}


def _report(tree: Path, env: dict, jobs: int, cache: Path | None) -> bytes:
    cmd = [sys.executable, "-m", "fsdplint", "check", ".", "--isolated", "--exit-zero", "--output-format", "json",
           "--jobs", str(jobs)]
    cmd += ["--cache-dir", str(cache)] if cache is not None else ["--no-cache"]
    env = {k: v for k, v in env.items() if k != "FSDPLINT_CACHE_DIR"}
    proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} in {tree} exited {proc.returncode}:\n{proc.stderr.decode(errors='replace')}")
    return proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", type=Path)
    ap.add_argument("--against", type=Path, help="another fsdplint source tree (fsdplint/ and rules/)")
    ap.add_argument("--all-modes", action="store_true", help="run --against in every mode, not only -j 1 --no-cache")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="write every report here (TREE.REVISION.MODE.json)")
    args = ap.parse_args()
    revisions = [("this", _env(HERE.parent))]
    if args.against:
        revisions.append((args.against.name, _env(args.against.resolve())))
    modes = ["j1", f"j{args.jobs}", "j1-cache-cold", "j1-cache-warm", f"j{args.jobs}-cache-warm"]
    runs = {rev: modes if rev == "this" or args.all_modes else modes[:1] for rev, _ in revisions}
    print("| tree | findings | " + " | ".join(f"{rev} {m}" for rev, _ in revisions for m in runs[rev]) + " |")
    print("|---|---|" + "---|" * sum(len(m) for m in runs.values()), flush=True)
    failed = False
    with tempfile.TemporaryDirectory(prefix="fsdplint-same-") as scratch:
        for tree in (t.resolve() for t in args.trees):
            reports: dict = {}
            for rev, env in revisions:
                cache = Path(scratch) / f"{tree.name}-{rev}-cache"
                reports[rev, "j1"] = _report(tree, env, 1, None)
                if len(runs[rev]) == 1:
                    continue
                reports[rev, modes[1]] = _report(tree, env, args.jobs, None)
                reports[rev, "j1-cache-cold"] = _report(tree, env, 1, cache)
                reports[rev, "j1-cache-warm"] = _report(tree, env, 1, cache)
                reports[rev, modes[4]] = _report(tree, env, args.jobs, cache)
            base = reports["this", "j1"]
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                for (rev, m), out in reports.items():
                    (args.keep / f"{tree.name}.{rev}.{m}.json").write_bytes(out)
            cells = []
            for rev, _ in revisions:
                for m in runs[rev]:
                    same = reports[rev, m] == base
                    failed |= not same
                    cells.append("=" if same else "DIFFERS")
            n = base.count(b'"code"')
            print(f"| {tree.name} | {n} | " + " | ".join(cells) + " |", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
