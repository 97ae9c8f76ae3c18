"""A run's results in fsdplint's findings and formats, plus the per-rank memory table."""

from __future__ import annotations

import os
from typing import TextIO

from fsdplint.findings import Finding, Position
from fsdplint.run.errors import JOB_RAISED
from fsdplint.run.runner import RunResult

POINTS = ("wrap", "optimizer", "forward", "step")


def _gib(n: int) -> str:
    return f"{n / 1024 ** 3:.2f} GiB" if n >= 1024 ** 2 else f"{n / 1024:.1f} KiB"


def _display(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def findings(result: RunResult) -> list[Finding]:
    from fsdplint.findings import finding_from_json
    from fsdplint.runtime.codes import make_finding

    merged: dict[tuple, Finding] = {}
    ranks: dict[tuple, list] = {}

    def add(f: Finding, rank: int) -> None:
        key = (f.code, f.filename, f.start.row, f.message)
        merged.setdefault(key, f)
        ranks.setdefault(key, []).append(rank)

    for r in result.ranks:
        d = r.data
        where = d.get("stop_frame")
        for raw in d.get("findings") or ():
            f = finding_from_json(raw)
            if where:
                f.filename, f.start, f.end = _display(where[0]), Position(where[1], 1), Position(where[1], 1)
                f.source_line = where[2]
            add(f, r.rank)
        exc = d.get("exception")
        if exc:
            code = exc.get("code") or JOB_RAISED
            f = make_finding(code, f"the job raises {exc['text']}"
                             + ("" if code == JOB_RAISED else f" (see `fsdplint rule {code}`)"))
            frame = exc.get("frame")
            if frame:
                f.filename, f.start, f.end = _display(frame[0]), Position(frame[1], 1), Position(frame[1], 1)
                f.source_line = frame[2]
            add(f, r.rank)
        if r.timed_out:
            add(make_finding(JOB_RAISED, f"rank {r.rank} did not reach its first step within the time limit "
                                         f"(last point: {_last(d)})"), r.rank)
        elif d.get("crashed"):
            tail = r.stderr.strip().splitlines()[-1:] or ["no output"]
            add(make_finding(JOB_RAISED, f"rank {r.rank} died without a result: {tail[0][:300]}"), r.rank)
        mem = d.get("memory")
        if mem and mem["total"] > result.gpu_memory:
            add(make_finding("FSDP017", f"rank {r.rank} holds {_gib(mem['total'])} of parameters, gradients and "
                                        f"AdamW state before any activation, over the {_gib(result.gpu_memory)} "
                                        f"of --gpu-memory: shard over more ranks, quantize the base, or offload"),
                r.rank)
    out = []
    for key, f in merged.items():
        rs = ranks[key]
        f.notes["ranks"] = ",".join(map(str, rs))
        f.message += f" [rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} of {result.world_size}]"
        out.append(f)
    return out


def _last(d: dict) -> str:
    reached = d.get("reached") or []
    return reached[-1] if reached else "start"


def write_summary(result: RunResult, out: TextIO) -> None:
    job = result.job
    out.write(f"fsdplint run: {job.text}\n")
    out.write(f"  world: {result.world_size} ranks ({result.local_world_size} per node), simulated ranks "
              f"{', '.join(str(r.rank) for r in result.ranks)}; {result.seconds:.1f}s\n")
    notes: list[str] = []
    for r in result.ranks:
        d = r.data
        reached = d.get("reached") or []
        stop = d.get("point")
        how = {"forward": "stopped at its first training forward (model wrapped, optimizer built)",
               "step": "stopped at its first optimizer.step()",
               "end": "ran to its end without a training step", "exit": "exited",
               "start": "did not reach a wrap"}.get(stop, stop)
        if d.get("exception"):
            how = f"raised {'after reaching ' + reached[-1] if reached else 'before any wrap'}"
        out.write(f"  rank {r.rank}: {how} ({', '.join(reached) or 'nothing'}; {d.get('seconds', 0):.1f}s)\n")
        for n in d.get("notes") or ():
            if n not in notes:
                notes.append(n)
    rows = [(r.rank, r.data["memory"]) for r in result.ranks if r.data.get("memory")]
    if rows:
        out.write(f"  per-rank memory (before activations; --gpu-memory {_gib(result.gpu_memory)}):\n")
        out.write(f"    {'rank':>4}  {'params':>12}  {'grads':>12}  {'optimizer':>12}  {'total':>12}\n")
        for rank, m in rows:
            out.write(f"    {rank:>4}  {_gib(m['params']):>12}  {_gib(m['grads']):>12}  {_gib(m['optimizer']):>12}  "
                      f"{_gib(m['total']):>12}\n")
    for n in notes:
        out.write(f"  note: {n}\n")
