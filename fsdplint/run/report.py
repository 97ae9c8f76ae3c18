"""A run's results in fsdplint's findings and formats, plus the per-rank memory table."""

from __future__ import annotations

import os
import re
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
            f = make_finding(code, raised_message(exc["text"], code))
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
        for code, message in d.get("full_size_findings") or ():
            # What the real config shows (memory over budget, ranks without trainable shards): at the
            # line where the job stopped, as the live findings are.
            f = make_finding(code, f"at the real size ({(d.get('memory') or {}).get('source', 'the config')}): "
                                   f"{message}")
            if where:
                f.filename, f.start, f.end = _display(where[0]), Position(where[1], 1), Position(where[1], 1)
                f.source_line = where[2]
            add(f, r.rank)
    out = []
    for key, f in merged.items():
        rs = ranks[key]
        f.notes["ranks"] = ",".join(map(str, rs))
        f.message += f" [rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} of {result.world_size}]"
        out.append(f)
    from fsdplint.run import ranks as rank_paths

    extra = rank_paths.findings(result)  # what only a comparison of the ranks shows
    if result.until == "save":
        from fsdplint.run import saving

        extra += saving.findings(result)  # what each rank's first save wrote
    hung = {f.notes.get("ranks") for f in extra if f.notes.get("before_exception")}
    if hung:  # a rank that hangs in a collective on the cluster never reaches the exception it raised here
        out = [f for f in out if not _is_exception(f) or f.notes.get("ranks") not in hung]
    for f in extra:
        f.filename = _display(f.filename) if not f.filename.startswith("<") else f.filename
        out.append(f)
    return out


def _is_exception(f: Finding) -> bool:
    return f.message.startswith("the job raises ")


def raised_message(text: str, code: str) -> str:
    """What the job raised, quoted whole (its own `:` is not where the short form cuts), and for a
    module the job imports but this environment lacks, what to install: the cluster's environment may
    have it, the dry run's does not."""
    quote = next((q for q in "`\"" if q not in text), "")  # a quote the text does not itself use
    message = f"the job raises {quote}{text}{quote}" + ("" if code == JOB_RAISED else f" (see `fsdplint rule {code}`)")
    missing = re.match(r"ModuleNotFoundError: No module named '([^']+)'", text)
    if missing:
        top = missing.group(1).split(".")[0]
        message += (f": the job imports `{missing.group(1)}`, which is not installed where the dry run runs. "
                    f"Install `{top}` in the environment fsdplint runs in to take the job past this import")
    return message


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
        after = d.get("stopped_after")
        how = {"step": f"reached the first optimizer step in {after:.1f}s (forward and backward ran)"
                       if after is not None else "reached the first optimizer step",
               "forward": "stopped at its first training forward (" + (
                   "under CUDA autocast" if d.get("autocast_stop") else "model on meta")
                   + ": forward and backward not run)",
               "save": "reached its first save after the first optimizer step (what it wrote was judged)",
               "end": ("ran to its end after its first optimizer step without saving" if "step" in reached else
                       "ran to its end without an optimizer step (the checks ran on the model it left)"),
               "exit": "exited",
               "start": "did not reach a wrap"}.get(stop, stop)
        if d.get("exception"):
            how = f"raised {'after reaching ' + reached[-1] if reached else 'before any wrap'}"
        out.write(f"  rank {r.rank}: {how} ({', '.join(reached) or 'nothing'}; {d.get('seconds', 0):.1f}s)\n")
        for n in d.get("notes") or ():
            if n not in notes:
                notes.append(n)
    differ = ranks_differ(result)
    if differ:
        out.write(f"  ranks differ: {differ}\n")
    _memory_table(result, out)
    for n in notes:
        out.write(f"  note: {n}\n")


def ranks_differ(result: RunResult) -> str:
    """Where the simulated ranks took different paths: the points reached, where they stopped, what
    they raised, the settings their live models show."""
    if len(result.ranks) < 2:
        return ""
    parts = []
    for what, get in (("reached", lambda d: ", ".join(d.get("reached") or []) or "nothing"),
                      ("stopped at", lambda d: d.get("point")),
                      ("raised", lambda d: (d.get("exception") or {}).get("text") or "nothing"),
                      ("live settings", lambda d: _settings_text(d.get("settings")))):
        values = [(r.rank, get(r.data)) for r in result.ranks]
        if len({v for _, v in values}) > 1:
            parts.append(f"{what}: " + "; ".join(f"rank {rank} {v}" for rank, v in values))
    return " | ".join(parts)


def _settings_text(s) -> str:
    if not s:
        return "none"
    return ", ".join(f"{k}={v}" for k, v in sorted((s.get("fsdp") or {}).items())) + \
        (f", lora r={s['lora'].get('r')}" if s.get("lora") else "")


def _memory_table(result: RunResult, out: TextIO) -> None:
    rows = [(r.rank, r.data["memory"]) for r in result.ranks if r.data.get("memory")]
    if not rows:
        return
    first = rows[0][1]
    out.write(f"  per-rank memory at the real size ({first.get('source')}; fsdplint model's audit with the live "
              f"job's settings, {first.get('seconds', 0):.1f}s; --gpu-memory {_gib(result.gpu_memory)}):\n")
    for rank, m in rows:
        if m.get("total") is not None:
            out.write(f"    rank {rank:>4}: {_gib(m['total'])}\n")
    out.write(f"    fullest rank {first['fullest_rank']}: {_gib(first['fullest_total'])} =\n")
    for label, n, on_device in first.get("lines") or ():
        out.write(f"      {_gib(n):>12}  {label}{'' if on_device else ' (host, not counted)'}\n")
