"""Per-rank memory estimate at the planned world size. Each line says how it was computed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from fsdplint.audit.plan import Plan


@dataclass
class MemoryLine:
    label: str
    bytes: int
    how: str
    # False for host memory (AdamW's step counters by default): shown, not in the GPU total.
    on_device: bool = True


@dataclass
class MemoryEstimate:
    world_size: int
    rank: int  # the rank with the largest total (shards can be uneven)
    lines: list[MemoryLine]
    # Sum of the real DTensor local shards on rank 0 (FSDP2 only), for cross-checking.
    dtensor_local_bytes_rank0: Optional[int] = None
    per_rank_totals: list[int] = field(default_factory=list)
    activations: Any = None  # ActivationEstimate when a sequence length was given

    @property
    def total(self) -> int:
        return sum(line.bytes for line in self.lines if line.on_device)

    def line(self, label_prefix: str) -> Optional[MemoryLine]:
        return next((ln for ln in self.lines if ln.label.startswith(label_prefix)), None)


STEP_BYTES = 4  # AdamW `step`: a float32 scalar tensor per parameter with state (torch optim/adam.py)


_OFFLOADED = ("sharded parameters", "shard padding", "4-bit base weights", "gradients", "AdamW")


def estimate(plan: Plan, *, activations: Any = None, adamw_fused: bool = False, offload: bool = False) -> MemoryEstimate:
    ws = plan.world_size
    replicated = plan.ignored + plan.unmanaged
    rep_bytes = sum(p.storage_bytes for p in replicated)
    rep_train = sum(p.storage_bytes for p in replicated if p.requires_grad)
    rep_tensors = sum(1 for p in replicated if p.requires_grad)
    four_bit = [p for p in [q for u in plan.units for q in u.params] + replicated if p.kind == "4bit"]
    quant_state = sum(p.quant_state_bytes for p in four_bit)
    act = activations.bytes if activations is not None else 0
    gathered = max((u.unsharded_bytes for u in plan.units), default=0)
    largest = max(plan.units, key=lambda u: u.unsharded_bytes, default=None)

    def col(attr: str, r: int) -> int:
        return sum(getattr(u, attr)[r] for u in plan.units if getattr(u, attr))

    def steps(r: int) -> int:
        return STEP_BYTES * (col("trainable_tensors", r) + rep_tensors)

    totals = []
    for r in range(ws):
        params = col("param_bytes", r) + col("quant_bytes", r)
        sharded = params + col("grad_bytes", r) + 2 * col("trainable_bytes", r)
        totals.append((0 if offload else sharded) + rep_bytes + quant_state + rep_train + 2 * rep_train
                      + (steps(r) if adamw_fused and not offload else 0) + gathered + act)
    rank = max(range(ws), key=lambda r: (totals[r], -r))
    local = col("local_param_bytes", rank)
    padding = col("param_bytes", rank) - local
    if plan.version == 2:
        how_params = (f"sum of rank {rank}'s real shards of the DTensors fully_shard created "
                      f"(torch.chunk rows on dim 0)")
        how_pad = "FSDP2 pads every shard to ceil(dim0/N) rows"
    elif plan.executed:
        how_params = "rank's chunk of each real FlatParameter FullyShardedDataParallel built (N equal chunks)"
        how_pad = "FSDP1 pads each flat parameter to a multiple of N"
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
                                "(meta Params4bit are not quantized)"))
    if rep_bytes:
        lines.append(MemoryLine("unsharded parameters (ignored / outside every unit)", rep_bytes,
                                "full size on every rank: FSDP does not shard them"))
    if quant_state:
        lines.append(MemoryLine(
            "4-bit quant_state (replicated)", quant_state,
            f"bnb quantize_4bit run on meta for each of the {len(four_bit)} 4-bit weights: float32 absmax per "
            f"block + 16-value code (double quant: uint8 absmax, offset, nested absmax + 256-value code); "
            f"kept whole on the module on every rank, FSDP does not flatten it"))
    grads = col("grad_bytes", rank) + rep_train
    grad_how = "trainable parameters only, sharded like their parameters, in the parameter dtype"
    if plan.version == 1:
        grad_how = "whole flat-parameter shard (padding included) of every unit with a trainable parameter"
    lines.append(MemoryLine("gradients", grads, grad_how))
    adam_how = "exp_avg + exp_avg_sq for trainable elements only, in the parameter dtype"
    if plan.version == 1 and not plan.use_orig_params:
        adam_how = ("exp_avg + exp_avg_sq shaped like the rank's shard of each trainable FlatParameter "
                    "(padding included), in the parameter dtype")
    lines.append(MemoryLine("AdamW state", 2 * (col("trainable_bytes", rank) + rep_train), adam_how))
    n_steps = steps(rank) // STEP_BYTES
    if n_steps:
        what = ("one FlatParameter per unit with trainable parameters" if plan.version == 1 and not plan.use_orig_params
                else "one per trainable parameter" + (" with elements in this rank's shard"
                                                       if plan.version == 1 else ""))
        where = ("on the GPU (fused=True)" if adamw_fused
                 else "on the CPU, not in the GPU total (torch keeps them there unless fused or capturable)")
        lines.append(MemoryLine("AdamW step counters", steps(rank),
                                f"{n_steps} float32 scalars, {what}; {where}", on_device=adamw_fused))
    if largest is not None:
        lines.append(MemoryLine(
            f"largest unit all-gathered ({largest.label})", gathered,
            "unsharded size of the biggest unit during its forward/backward"
            + (", in the mixed-precision param dtype" if plan.param_dtype else "")
            + "; prefetch can hold the next unit too"
            + ("" if activations is not None else "; activations not included (give --seq-len)")))
    if activations is not None:
        ac = "activation checkpointing" if activations.checkpointing else "no checkpointing"
        lines.append(MemoryLine(
            f"activations (micro-batch {activations.micro_batch} x seq {activations.seq_len}, {ac})",
            act, "peak of one training step's tensors beyond parameters and gradients: " + activations.formula))
    if offload:
        lines = _offloaded(lines, rep_train)
    local0 = sum(u.local_bytes or 0 for u in plan.units) if plan.version == 2 else None
    return MemoryEstimate(world_size=ws, rank=rank, lines=lines, dtensor_local_bytes_rank0=local0,
                          per_rank_totals=totals, activations=activations)


def _offloaded(lines: list, rep_train: int) -> list:
    """With CPU offload the shards FSDP manages (parameters, their gradients, the optimizer state built
    on them) live in host memory: shown, not in the GPU total. What FSDP does not manage stays."""
    out = []
    for line in lines:
        if not line.label.startswith(_OFFLOADED):
            out.append(line)
            continue
        keep = rep_train * (2 if line.label == "AdamW state" else 1) if line.label in ("gradients", "AdamW state") else 0
        moved = line.bytes - keep
        out.append(MemoryLine(f"{line.label} (CPU offload)", moved,
                              line.how + "; in host memory under CPU offload, not in the GPU total", on_device=False))
        if keep:
            out.append(MemoryLine(f"{line.label} of unsharded parameters", keep,
                                  "parameters FSDP does not manage are not offloaded"))
    return out


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
