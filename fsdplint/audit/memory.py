"""Per-rank memory estimate at the planned world size. Each line says how it was computed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from fsdplint.audit.plan import Plan


@dataclass
class MemoryLine:
    label: str
    bytes: int
    how: str


@dataclass
class MemoryEstimate:
    world_size: int
    rank: int  # the rank with the largest total (shards can be uneven)
    lines: list[MemoryLine]
    # Sum of the real DTensor local shards on rank 0 (FSDP2 only), for cross-checking.
    dtensor_local_bytes_rank0: Optional[int] = None
    per_rank_totals: list[int] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(line.bytes for line in self.lines)

    def line(self, label_prefix: str) -> Optional[MemoryLine]:
        return next((ln for ln in self.lines if ln.label.startswith(label_prefix)), None)


def estimate(plan: Plan) -> MemoryEstimate:
    ws = plan.world_size
    replicated = plan.ignored + plan.unmanaged
    rep_bytes = sum(p.storage_bytes for p in replicated)
    rep_train = sum(p.storage_bytes for p in replicated if p.requires_grad)
    gathered = max((u.unsharded_bytes for u in plan.units), default=0)
    largest = max(plan.units, key=lambda u: u.unsharded_bytes, default=None)

    def col(attr: str, r: int) -> int:
        return sum(getattr(u, attr)[r] for u in plan.units if getattr(u, attr))

    totals = []
    for r in range(ws):
        params = col("param_bytes", r) + col("quant_bytes", r)
        totals.append(params + rep_bytes + col("grad_bytes", r) + rep_train
                      + 2 * (col("trainable_bytes", r) + rep_train) + gathered)
    rank = max(range(ws), key=lambda r: (totals[r], -r))
    local = col("local_param_bytes", rank)
    padding = col("param_bytes", rank) - local
    if plan.version == 2:
        how_params = (f"sum of rank {rank}'s real shards of the DTensors fully_shard created "
                      f"(torch.chunk rows on dim 0)")
        how_pad = "FSDP2 pads every shard to ceil(dim0/N) rows"
    else:
        how_params = "computed: each unit's flat parameter split into N equal chunks"
        how_pad = "computed: flat parameter padded to a multiple of N"
    lines = [MemoryLine("sharded parameters", local, how_params)]
    if padding:
        lines.append(MemoryLine("shard padding", padding, how_pad))
    quant = col("quant_bytes", rank)
    if quant:
        lines.append(MemoryLine("4-bit base weights (sharded)", quant,
                                "computed: numel/2 bytes packed in quant_storage, split like a DTensor "
                                "(meta Params4bit are not quantized); quant_state not counted"))
    if rep_bytes:
        lines.append(MemoryLine("unsharded parameters (ignored / outside every unit)", rep_bytes,
                                "full size on every rank: FSDP does not shard them"))
    grads = col("grad_bytes", rank) + rep_train
    grad_how = "trainable parameters only, sharded like their parameters, in the parameter dtype"
    if plan.version == 1 and plan.use_orig_params:
        grad_how = "computed: whole flat-parameter shard of every unit with a trainable parameter"
    lines.append(MemoryLine("gradients", grads, grad_how))
    lines.append(MemoryLine("AdamW state", 2 * (col("trainable_bytes", rank) + rep_train),
                            "exp_avg + exp_avg_sq for trainable elements only, in the parameter dtype"))
    if largest is not None:
        lines.append(MemoryLine(
            f"largest unit all-gathered ({largest.label})", gathered,
            "unsharded size of the biggest unit during its forward/backward"
            + (f", in the mixed-precision param dtype" if plan.param_dtype else "")
            + "; prefetch can hold the next unit too; activations not included"))
    local0 = sum(u.local_bytes or 0 for u in plan.units) if plan.version == 2 else None
    return MemoryEstimate(world_size=ws, rank=rank, lines=lines, dtensor_local_bytes_rank0=local0,
                          per_rank_totals=totals)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
