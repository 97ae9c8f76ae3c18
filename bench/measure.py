"""Time whole processes: wall time and peak RSS of each run, median/min/max over runs."""

from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

try:  # Optional: lets us add up the RSS of worker processes (-j N).
    import psutil
except ImportError:  # pragma: no cover - the harness works without it
    psutil = None


@dataclass
class Result:
    label: str
    cmd: list[str]
    times: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)  # largest single process of the run
    tree_rss_mb: list[float] = field(default_factory=list)  # sampled sum over the process tree
    rc: int | None = None
    error: str | None = None  # set when the tool is unavailable or failed
    last_line: str = ""  # last non-empty stdout line of the last run (e.g. the linter's summary)
    cpu: list[float] = field(default_factory=list)  # user + sys seconds of the process and its workers
    loads: list[float] = field(default_factory=list)  # 1-minute load average before each measured run

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)

    @property
    def peak_rss(self) -> float:
        return max(self.rss_mb)

    @property
    def peak_tree_rss(self) -> float | None:
        return max(self.tree_rss_mb) if self.tree_rss_mb else None


def _sample_tree(pid: int, stop: threading.Event, out: list[float]) -> None:
    peak = 0
    try:
        root = psutil.Process(pid)
        while not stop.wait(0.1):
            total = 0
            for proc in [root, *root.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            peak = max(peak, total)
    except psutil.Error:
        pass
    out.append(peak / 2**20)


def run_once(cmd: list[str], *, cwd: Path | None = None, env: dict | None = None, log: Path | None = None,
             sample_tree: bool = False, timeout: float = 1800) -> tuple[float, float, float, float | None, int, str]:
    """One run: (wall s, CPU s, peak RSS MB of the largest process, tree RSS MB or None, rc, stdout)."""
    stdout_path = log or Path(os.devnull)
    if env is None:
        # Measure tools as installed: pip compiles bytecode at install time, so an environment
        # that sets PYTHONDONTWRITEBYTECODE must not make every run recompile the sources.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with open(stdout_path, "wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        stop, tree = threading.Event(), []
        sampler = None
        if sample_tree and psutil is not None:
            sampler = threading.Thread(target=_sample_tree, args=(proc.pid, stop, tree), daemon=True)
            sampler.start()
        killer = threading.Timer(timeout, proc.kill)
        killer.daemon = True
        killer.start()
        try:
            # wait4 gives this child's own rusage (ru_maxrss covers it and its reaped children).
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # interrupted (Ctrl-C, SIGTERM): do not leave the child running
            proc.kill()
            os.wait4(proc.pid, 0)
            raise
        finally:
            killer.cancel()
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        if sampler:
            sampler.join()
    text = log.read_text(errors="replace") if log else ""
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024, (tree[0] if tree else None), proc.returncode, text


def measure(label: str, cmd: list[str], *, runs: int, warmup: int = 1, ok_codes=(0, 1), log: Path | None = None,
            sample_tree: bool = False, cwd: Path | None = None, env: dict | None = None,
            echo=print) -> Result:
    """Run `cmd` warmup + runs times; a run whose exit code is not in ok_codes marks the result failed."""
    res = Result(label, cmd)
    for i in range(warmup + runs):
        load = os.getloadavg()[0]
        wall, cpu, rss, tree, rc, text = run_once(cmd, cwd=cwd, env=env, log=log, sample_tree=sample_tree)
        res.rc = rc
        lines = [ln for ln in text.splitlines() if ln.strip()]
        res.last_line = lines[-1].strip() if lines else ""
        if "Traceback (most recent call last)" in text:  # a crash, whatever the exit code says
            rc = rc if rc not in ok_codes else -1
        if rc not in ok_codes:
            tail = " | ".join(lines[-3:])[-400:]
            res.error = f"{'crashed' if rc == -1 else f'exit code {rc}'}: {tail}" if tail else f"exit code {rc}"
            echo(f"  {label}: FAILED ({res.error})")
            return res
        if i >= warmup:
            res.times.append(wall)
            res.rss_mb.append(rss)
            res.loads.append(load)
            res.cpu.append(cpu)
            if tree is not None:
                res.tree_rss_mb.append(tree)
        which = "warmup" if i < warmup else f"run {i - warmup + 1}/{runs}"
        echo(f"  {label}: {which} {wall:.2f} s, CPU {cpu:.2f} s, {rss:.0f} MB, load {load:.1f}")
    return res


def unavailable(label: str, cmd: list[str], why: str) -> Result:
    return Result(label, cmd, error=f"not available: {why}")


def measure_interleaved(specs: list[dict], *, runs: int, echo=print) -> list[Result]:
    """Like `measure` for several commands, run round-robin so that load changes hit all of them alike.

    Each spec holds `label`, `cmd` and optionally `warmup`, `ok_codes`, `log`, `sample_tree`.
    """
    results = [Result(s["label"], s["cmd"]) for s in specs]
    for spec, res in zip(specs, results):
        for _ in range(spec.get("warmup", 0)):
            _one(spec, res, None, echo)
    for i in range(runs):
        for spec, res in zip(specs, results):
            if res.error is None:
                _one(spec, res, f"run {i + 1}/{runs}", echo)
    return results


def _one(spec: dict, res: Result, which: str | None, echo) -> None:
    if res.error is not None:
        return
    load = os.getloadavg()[0]
    wall, cpu, rss, tree, rc, text = run_once(spec["cmd"], cwd=spec.get("cwd"), log=spec.get("log"),
                                              sample_tree=spec.get("sample_tree", False))
    lines = [ln for ln in text.splitlines() if ln.strip()]
    res.rc, res.last_line = rc, (lines[-1].strip() if lines else "")
    if "Traceback (most recent call last)" in text and rc in spec.get("ok_codes", (0, 1)):
        rc = -1
    if rc not in spec.get("ok_codes", (0, 1)):
        tail = " | ".join(lines[-3:])[-400:]
        res.error = f"{'crashed' if rc == -1 else f'exit code {rc}'}: {tail}" if tail else f"exit code {rc}"
        echo(f"  {res.label}: FAILED ({res.error})")
        return
    if which is not None:
        res.times.append(wall)
        res.cpu.append(cpu)
        res.rss_mb.append(rss)
        res.loads.append(load)
        if tree is not None:
            res.tree_rss_mb.append(tree)
    echo(f"  {res.label}: {which or 'warmup'} {wall:.2f} s, CPU {cpu:.2f} s, {rss:.0f} MB, load {load:.1f}")
