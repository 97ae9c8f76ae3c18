"""Run a check at other releases of one library, over the installed stack: the per-release mode of bench/facts.

    python bench/facts/release_run.py trl --code 'from trl import GRPOTrainer' --from 0.15.0 --to 0.20.0
    python bench/facts/release_run.py peft --script bench/facts/fsdp402_nested_save_check.py --at 0.12.0
    python bench/facts/release_run.py bitsandbytes --script bench/facts/fsdp201_cpu_check.py --at 0.43.3

Each release is installed with `pip install --no-deps --target DIR` into a cache directory outside the
repository (`--cache`, default ~/.cache/fsdplint-release-run) and put first on PYTHONPATH, so it shadows
the installed release while everything else (torch, the other libraries) stays as installed: the run
measures that release with this torch. A release that cannot run here (an import error against the
installed torch or transformers) is reported with its error's last line, which is the recorded reason.

`--at V` runs once and prints the output's tail; `--from/--to` bisect on the exit status (0 = holds) and
print the last release where it fails and the first where it succeeds (`--until`: the reverse), each with
the last line of its output, the two adjacent releases to record.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from release_bisect import bisect, index_versions  # noqa: E402

from packaging.version import Version  # noqa: E402


def install(package: str, version: str, cache: Path) -> Path:
    d = cache / package / version
    if not (d / ".done").exists():
        d.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                            "--target", str(d), f"{package}=={version}"], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{package}=={version} does not install: {r.stderr.strip().splitlines()[-1:]}")
        (d / ".done").write_text("")
    return d


def install_extras(specs: list[str], cache: Path) -> list[Path]:
    """Packages the release needs that the environment lacks (`--with requests`), each in its own directory."""
    out = []
    for spec in specs:
        d = cache / "_with" / spec.replace("=", "_").replace("<", "_").replace(">", "_")
        if not (d / ".done").exists():
            d.mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                            str(d), spec], capture_output=True, check=True)
            (d / ".done").write_text("")
        out.append(d)
    return out


def run_at(package: str, version: str, argv: list[str], cache: Path, timeout: float,
           extras: list[str] = ()) -> tuple[int, str]:
    """(exit status, output) of `argv` with `package==version` first on the path."""
    try:
        d = install(package, version, cache)
    except RuntimeError as e:
        return 2, str(e)
    path = [str(d)] + [str(x) for x in install_extras(list(extras), cache)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    try:
        r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s"
    return r.returncode, (r.stdout + r.stderr)


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("package")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--code", help="python code to run (python -c)")
    g.add_argument("--script", help="a python script to run")
    p.add_argument("--at", help="run at this release only")
    p.add_argument("--from", dest="lo")
    p.add_argument("--to", dest="hi")
    p.add_argument("--until", action="store_true", help="find where it stops succeeding")
    p.add_argument("--linear", action="store_true")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--with", dest="extras", action="append", default=[],
                   help="a package the release imports that the environment lacks (installed beside it, no deps)")
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/fsdplint-release-run"))
    args = p.parse_args(argv)
    cmd = ["-c", args.code] if args.code else [args.script]
    cache = Path(args.cache)
    if args.at:
        rc, out = run_at(args.package, args.at, cmd, cache, args.timeout, args.extras)
        print(f"{args.package} {args.at}: exit {rc}")
        print("\n".join(out.strip().splitlines()[-15:]))
        return 0
    versions = [v for v in index_versions(args.package)
                if (args.lo is None or Version(v) >= Version(args.lo)) and (args.hi is None or Version(v) <= Version(args.hi))]
    seen: dict[str, str] = {}

    def holds(v: str) -> bool:
        rc, out = run_at(args.package, v, cmd, cache, args.timeout, args.extras)
        seen[v] = f"exit {rc}: {last_line(out)}"
        ok = rc == 0
        return (not ok) if args.until else ok

    before, first = bisect(versions, holds, args.linear, log=lambda s: print(s, flush=True))
    for v in (before, first):
        if v is not None:
            print(f"  {v}: {seen.get(v, '')}")
    what = "stops succeeding" if args.until else "succeeds"
    if first is None:
        print(f"{args.package}: it never {what} in {versions[0]}..{versions[-1]}")
        return 1
    print(f"{args.package}: first release where it {what}: {first}; the release before: {before or '(none run)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
