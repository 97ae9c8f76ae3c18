"""The shard plan: which FSDP unit manages which parameter, and what each rank holds.

FSDP2 is executed: the real `fully_shard` runs on the meta model under a fake
process group of the requested world size (see `plan_fsdp2`). The FSDP1 plan is
computed with torch's own wrap-policy code, then `FullyShardedDataParallel` runs on
a fake-tensor copy of the model and its flat parameters are checked against it
(see `plan_fsdp1`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from fsdplint.audit.params import ParamInfo


@dataclass(eq=False)
class Unit:
    name: str  # module FQN; "" is the root
    cls: str
    params: list[ParamInfo]
    # Per rank: bytes of parameter storage this unit allocates (padding included), bytes of
    # the rank's real shard, bytes of 4-bit packed weights, trainable elements in the rank's
    # shard, and bytes of sharded gradient.
    param_bytes: list[int] = field(default_factory=list)
    local_param_bytes: list[int] = field(default_factory=list)
    quant_bytes: list[int] = field(default_factory=list)
    trainable_elems: list[int] = field(default_factory=list)
    trainable_bytes: list[int] = field(default_factory=list)
    grad_bytes: list[int] = field(default_factory=list)
    # Tensors the rank's optimizer holds state for (one AdamW `step` each).
    trainable_tensors: list[int] = field(default_factory=list)
    # Bytes while all-gathered for compute (in the mixed-precision param dtype if any).
    unsharded_bytes: int = 0
    # FSDP2 only: bytes of the real DTensor local shards on rank 0 (no padding).
    local_bytes: Optional[int] = None

    @property
    def label(self) -> str:
        return self.name or "(root)"

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)


@dataclass
class PlanProblem:
    """An error torch raises (or would raise) for this plan."""

    code: str
    message: str
    unit: Optional[str] = None
    # Why torch raises it and what to change, when the plan knows more than torch's message.
    cause: str = ""
    # Codes of the earlier failures this one was found past (the plan copy assumed them fixed).
    after: tuple = ()


@dataclass
class Plan:
    version: int
    world_size: int
    executed: bool
    units: list[Unit]
    wrap_classes: list[str]
    wrap_unmatched: list[str]
    ignored: list[ParamInfo]
    # Not managed by any unit and not ignored.
    unmanaged: list[ParamInfo]
    # A shared parameter managed by more than one unit: (param, [unit labels]).
    split_shared: list[tuple[ParamInfo, list[str]]]
    problems: list[PlanProblem] = field(default_factory=list)
    param_dtype: Any = None
    reduce_dtype: Any = None
    use_orig_params: bool = False
    policy: str = ""
    # FSDP1: why the executed plan was not used (torch refused, or its flat parameters differ).
    mismatch: Optional[str] = None

    def unit_of(self, info: ParamInfo) -> list[Unit]:
        return [u for u in self.units if any(p is info for p in u.params)]


def chunk_rows(rows: int, world_size: int) -> tuple[int, list[int]]:
    """torch.chunk semantics on dim 0: (padded rows per rank, real rows per rank)."""
    per = -(-rows // world_size) if rows else 0
    return per, [max(0, min(per, rows - r * per)) for r in range(world_size)]


def wrap_modules(model, class_names: list[str]) -> tuple[list[tuple[str, Any]], list[str]]:
    """Modules whose class name is in `class_names`, children before parents."""
    wanted = set(class_names)
    found, seen = [], set()
    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if cls in wanted and name:
            found.append((name, mod))
            seen.add(cls)
    return list(reversed(found)), sorted(wanted - seen)
