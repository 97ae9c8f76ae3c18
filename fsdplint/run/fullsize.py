"""The memory table of the real config: `fsdplint model`'s audit, given the settings the live job shows.

The twin trains at reduced sizes, so its bytes say nothing about the cluster. The job's real config
(recorded by `models` at from_pretrained), dtype and quantization, with the FSDP version, wrap
classes, mixed precision, ignored 4-bit weights and offload read from the live wrapped model, the
LoRA config read from the live peft model, and the micro-batch and sequence length of the first
training forward, are audited on the meta device at the job's world size: per-rank shards, gradients,
AdamW state, the largest all-gathered unit and the activations, for every rank. Run once in the
parent for each distinct set of settings the simulated ranks report.
"""

from __future__ import annotations

import json
from typing import Optional

# Audit rules whose findings the run reports: what only the full size shows (the rest the live
# twin already shows, with the job's own line).
FULL_SIZE_CODES = {"FSDP017", "FSDP502"}


def audit(record: dict, gpu_memory: int) -> dict:
    """{"per_rank": [...], "rank": r, "lines": [(label, bytes, on_device)], "findings": [...],
    "notes": [...], "seconds": s} or {"error": text}."""
    import time

    from fsdplint.audit.env import quiet
    from fsdplint.audit.runner import run_audit
    from fsdplint.audit.spec import spec_from_dict

    started = time.perf_counter()
    real, settings = record["real"], record["settings"]
    config = dict(real["config"])
    config["architectures"] = [real["cls"]]
    data = {"model": config, "dtype": real["dtype"], "fsdp": settings["fsdp"], "gpu_memory": gpu_memory}
    if real.get("quantization"):
        data["quantization"] = real["quantization"]
    if settings.get("lora") is not None:
        data["lora"] = settings["lora"]
    training = {k: v for k, v in settings.get("training", {}).items() if v is not None}
    if training.get("seq_len"):
        data["training"] = training
    try:
        spec = spec_from_dict(data, filename=real.get("name") or "<config>")
        if settings.get("cast_after_lora"):
            spec.cast_after_lora = settings["cast_after_lora"]
        with quiet():
            result = run_audit(spec, select=FULL_SIZE_CODES)
    except Exception as e:  # noqa: BLE001 - the dry run's own limit: said so, the job's findings stand
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
    mem = result.memory
    return {"per_rank": list(mem.per_rank_totals), "rank": mem.rank,
            "lines": [(ln.label, ln.bytes, ln.on_device) for ln in mem.lines],
            "findings": [f.message for f in result.findings if f.code in FULL_SIZE_CODES],
            "codes": [f.code for f in result.findings if f.code in FULL_SIZE_CODES],
            "seconds": round(time.perf_counter() - started, 2)}


def key(record: Optional[dict]) -> Optional[str]:
    return None if not record else json.dumps(record, sort_keys=True, default=str)


def attach(result: dict, out: dict, rank: int) -> None:
    """Put an audit's figures for `rank` into a rank's result."""
    result["full_size"] = out
    if "error" in out:
        result["notes"].append(f"no memory table: the audit of the real config failed ({out['error']})")
        return
    per_rank = out["per_rank"]
    result["memory"] = {"total": per_rank[rank] if rank < len(per_rank) else None, "fullest_rank": out["rank"],
                        "fullest_total": max(per_rank, default=0), "lines": out["lines"],
                        "seconds": out["seconds"], "source": result["full_size_input"]["real"]["name"]}
    result["full_size_findings"] = list(zip(out["codes"], out["findings"]))


def complete(ranks: list, gpu_memory: int) -> None:
    """Every rank's memory from one audit per distinct set of live settings: the first rank's own,
    else one run here."""
    done: dict = {}
    for r in ranks:
        k = key(r.data.get("full_size_input"))
        if k and "full_size" in r.data:
            done[k] = r.data["full_size"]
    for r in ranks:
        k = key(r.data.get("full_size_input"))
        if not k or "full_size" in r.data:
            continue
        if k not in done:
            done[k] = audit(r.data["full_size_input"], gpu_memory)
        attach(r.data, done[k], r.rank)
