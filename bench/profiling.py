"""Profile one fsdplint run with py-spy and summarise the top costs as markdown lines.

py-spy samples every thread of the process (fsdplint lints in a worker thread with a deep
stack), and needs no change to the profiled code. Install it with `pip install py-spy`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

TOP = 15
RATE = 200  # samples per second

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _frame_key(frame: str) -> tuple[str, str]:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip(), ""
    path = m.group("file")
    for marker in ("site-packages/", "python3.11/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return m.group("func"), path


def summarise(raw: Path, top: int = TOP) -> list[str]:
    """Self and cumulative time per function from py-spy's collapsed-stack output."""
    self_n: dict = defaultdict(int)
    cum_n: dict = defaultdict(int)
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame_key(f) for f in stack.split(";")]
        if frames[-1][0] == "Thread._wait_for_tstate_lock":  # the main thread waiting for the lint thread
            continue
        total += n
        self_n[frames[-1]] += n
        for key in set(frames):
            cum_n[key] += n
    if not total:
        return ["(empty profile)"]
    secs = 1 / RATE
    out = [f"{total} samples at {RATE}/s ≈ {total * secs:.1f} s of CPU in the profiled process. "
           f"Top {top} functions by self time:", "",
           "| self s | % | function | file |", "|---|---|---|---|"]
    for (fn, path), n in sorted(self_n.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"| {n * secs:.2f} | {100 * n / total:.0f} | `{fn}` | `{path}` |")
    own = [(k, n) for k, n in cum_n.items() if k[1].startswith(("fsdplint/", "rules/")) or "parse_module" in k[0]]
    out += ["", f"Top {top} fsdplint functions (and libcst's parse) by cumulative time:", "",
            "| cumulative s | % | function | file |", "|---|---|---|---|"]
    for (fn, path), n in sorted(own, key=lambda kv: -kv[1])[:top]:
        out.append(f"| {n * secs:.2f} | {100 * n / total:.0f} | `{fn}` | `{path}` |")
    return out


def profile(argv: list[str], workdir: Path, echo=print) -> list[str]:
    """Run `fsdplint ARGV` under py-spy; keep the raw stacks in workdir; return a markdown summary."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(pyspy).exists():
        return ["Profile: py-spy is not installed (`pip install py-spy`)."]
    workdir.mkdir(parents=True, exist_ok=True)
    raw = workdir / "fsdplint.collapsed.txt"
    cmd = [pyspy, "record", "-r", str(RATE), "-f", "raw", "-o", str(raw), "--", *argv]
    echo("  profiling: " + " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if not raw.exists():
        return [f"Profile failed (exit {proc.returncode}): {' | '.join(proc.stderr.strip().splitlines()[-2:])}"]
    echo(f"  stacks written to {raw} (e.g. open with speedscope or flamegraph.pl)")
    return summarise(raw)
