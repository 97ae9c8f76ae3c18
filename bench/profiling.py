"""Profile one fsdplint run with pyinstrument and summarise the top costs as markdown lines."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

TOP = 15


def _short(path: str | None) -> str:
    """`.../site-packages/libcst/_nodes/base.py` -> `libcst/_nodes/base.py` (no machine paths)."""
    if not path:
        return "?"
    p = Path(path)
    for marker in ("site-packages", "lib"):
        if marker in p.parts:
            idx = len(p.parts) - 1 - p.parts[::-1].index(marker)
            return "/".join(p.parts[idx + 1:])
    for anchor in ("fsdplint", "rules"):
        if anchor in p.parts:
            return "/".join(p.parts[p.parts.index(anchor):])
    return p.name


def _walk(frame, stack: frozenset, self_t: dict, cum_t: dict) -> None:
    key = (frame.function or "?", _short(frame.file_path))
    self_t[key] += frame.total_self_time
    if key not in stack:  # count recursion once
        cum_t[key] += frame.time
        stack = stack | {key}
    for child in frame.children:
        _walk(child, stack, self_t, cum_t)


def summarise(session_path: Path, top: int = TOP) -> list[str]:
    from pyinstrument.session import Session

    session = Session.load(str(session_path))
    root = session.root_frame()
    if root is None:
        return ["(empty profile)"]
    self_t: dict = defaultdict(float)
    cum_t: dict = defaultdict(float)
    _walk(root, frozenset(), self_t, cum_t)
    total = session.duration
    out = [f"Wall {total:.2f} s under the profiler (sampling). Top {top} by self time:", "",
           "| self s | % | function | file |", "|---|---|---|---|"]
    for (fn, path), t in sorted(self_t.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"| {t:.2f} | {100 * t / total:.0f} | `{fn}` | `{path}` |")
    out += ["", f"Top {top} fsdplint/rules functions by cumulative time:", "",
            "| cumulative s | % | function | file |", "|---|---|---|---|"]
    own = [(k, t) for k, t in cum_t.items() if k[1].startswith(("fsdplint/", "rules/"))]
    for (fn, path), t in sorted(own, key=lambda kv: -kv[1])[:top]:
        out.append(f"| {t:.2f} | {100 * t / total:.0f} | `{fn}` | `{path}` |")
    return out


def profile(argv: list[str], workdir: Path, corpus_root: Path, echo=print) -> list[str]:
    """Run `fsdplint ARGV` under pyinstrument; write the html/session to workdir; return a summary."""
    try:
        import pyinstrument  # noqa: F401
    except ImportError:
        return ["Profile: pyinstrument is not installed (`pip install pyinstrument`)."]
    workdir.mkdir(parents=True, exist_ok=True)
    session = workdir / "fsdplint.pyisession"
    cmd = [sys.executable, "-m", "pyinstrument", "-r", "pyisession", "-o", str(session), "-m", "fsdplint", *argv]
    echo("  profiling: " + " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if not session.exists():
        return [f"Profile failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"]
    html = workdir / "fsdplint.html"
    subprocess.run([sys.executable, "-m", "pyinstrument", "--load", str(session), "-r", "html", "-o", str(html)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    echo(f"  profile written to {html}")
    return summarise(session)
