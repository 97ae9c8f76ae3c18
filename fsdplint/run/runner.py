"""The parent: one child process per simulated rank (rank 0 and the last rank, which sits on another
node when there are several), each with the environment its launcher would set, under a wall-clock
limit; their results become findings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fsdplint.run.command import Job


@dataclass
class RankResult:
    rank: int
    data: dict
    timed_out: bool = False
    stderr: str = ""


@dataclass
class RunResult:
    job: Job
    world_size: int
    local_world_size: int
    gpu_memory: int
    ranks: list[RankResult] = field(default_factory=list)
    seconds: float = 0.0
    until: str = "step"


def ranks_to_run(world_size: int) -> list[int]:
    return sorted({0, world_size - 1})


def rank_env(job: Job, rank: int, world_size: int, local_world_size: int) -> dict:
    env = dict(os.environ)
    env.update(job.env)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank % local_world_size), WORLD_SIZE=str(world_size),
               LOCAL_WORLD_SIZE=str(local_world_size), GROUP_RANK=str(rank // local_world_size),
               NODE_RANK=str(rank // local_world_size), MASTER_ADDR=env.get("MASTER_ADDR", "127.0.0.1"),
               MASTER_PORT=env.get("MASTER_PORT", "29500"), TORCHELASTIC_RUN_ID="fsdplint-dry-run")
    # The child imports this fsdplint, whatever the job's working directory.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def run(job: Job, *, world_size: int, local_world_size: int, gpu_memory: int, timeout: float,
        cwd: str, until: str = "step") -> RunResult:
    out = RunResult(job, world_size, local_world_size, gpu_memory, until=until)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fsdplint-run-") as tmp:
        procs = []
        for rank in ranks_to_run(world_size):
            spec = {"rank": rank, "world_size": world_size, "local_world_size": local_world_size,
                    "gpu_memory": gpu_memory, "result": os.path.join(tmp, f"rank{rank}.json"), "kind": job.kind,
                    "entry": job.entry, "argv0": job.argv0, "args": job.args, "cwd": cwd, "user_root": cwd,
                    "audit": rank == 0}
            if until == "save":
                # What the job saves goes here, never where it asks; deleted with the rest of the run's files.
                spec.update(until="save", writes=os.path.join(tmp, f"writes{rank}"))
            path = os.path.join(tmp, f"spec{rank}.json")
            with open(path, "w") as f:
                json.dump(spec, f)
            err = open(os.path.join(tmp, f"rank{rank}.err"), "w+")
            p = subprocess.Popen([sys.executable, "-m", "fsdplint.run.child", path], cwd=cwd,
                                 env=rank_env(job, rank, world_size, local_world_size),
                                 stdout=subprocess.DEVNULL, stderr=err)
            procs.append((rank, p, spec, err))
        deadline = time.monotonic() + timeout
        for rank, p, spec, err in procs:
            timed_out = False
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                timed_out = True
            err.seek(0)
            stderr = err.read()[-4000:]
            err.close()
            try:
                with open(spec["result"]) as f:
                    data = json.load(f)
            except (OSError, ValueError):
                data = {"rank": rank, "point": "start", "findings": [], "memory": None, "notes": [],
                        "exception": None, "crashed": True}
            out.ranks.append(RankResult(rank, data, timed_out, stderr))
    from fsdplint.run import fullsize

    fullsize.complete(out.ranks, gpu_memory)
    out.seconds = round(time.perf_counter() - started, 2)
    return out
