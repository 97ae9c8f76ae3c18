"""Which parameters of a live model FSDP manages, and how.

Only reads state that FSDP1 (`FullyShardedDataParallel`), FSDP2 (`fully_shard`),
DDP and `replicate` leave on the modules; never communicates.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

# Managed kinds.
FSDP2 = "fsdp2"  # in an FSDP2 param group (sharded or HSDP-replicated DTensor)
FSDP1 = "fsdp1"  # in an FSDP1 FlatParameter (or one of its original params)
DDP = "ddp"  # gradients all-reduced by DDP / replicate
SYNCED = "synced"  # the user registered a grad hook that syncs it (transformers does this)
TENSOR_PARALLEL = "dtensor"  # a DTensor outside FSDP: its layout is the user's choice
# Not managed.
IGNORED = "ignored"  # excluded at wrap time (ignored_params / ignored_states)
REPLACED = "replaced"  # FSDP sharded a param that was later re-created
UNMANAGED = "unmanaged"  # in no unit at all (added after wrapping, or never wrapped)

_WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def clean_fqn(fqn: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        fqn = fqn.replace(prefix, "")
    return fqn


@dataclass
class ParamRecord:
    fqn: str
    param: nn.Parameter
    owner: nn.Module
    kind: str
    unit: Optional[str] = None
    adapter: bool = False
    flat: bool = False

    @property
    def trainable(self) -> bool:
        return bool(self.param.requires_grad)


@dataclass
class FSDP2Group:
    unit: str
    orig_dtypes: dict = field(default_factory=dict)  # fqn -> original dtype, trainable params only


@dataclass
class ModelScan:
    params: list[ParamRecord]
    fsdp2_groups: list[FSDP2Group]
    has_fsdp1: bool
    has_fsdp2: bool

    @property
    def wrapped(self) -> bool:
        return self.has_fsdp1 or self.has_fsdp2


def _is_dtensor(t) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return isinstance(t, DTensor)


def _composable_state(module):
    try:
        from torch.distributed._composable_state import _get_module_state
    except ImportError:  # pragma: no cover
        return None
    return _get_module_state(module)


def _fsdp2_state_type():
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    except ImportError:
        try:  # torch 2.4-2.5
            from torch.distributed._composable.fsdp._fsdp_state import FSDPState
        except ImportError:  # pragma: no cover
            return None
    return FSDPState


def _fsdp1_type():
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover
        return None
    return FullyShardedDataParallel


def _adapter_param_ids(model: nn.Module) -> set[int]:
    """Params that belong to a peft adapter rather than to the base model."""
    ids: set[int] = set()
    tuners = sys.modules.get("peft.tuners.tuners_utils")
    base_tuner = getattr(tuners, "BaseTunerLayer", None)
    if base_tuner is None:
        return ids  # peft not imported: nothing can be a peft adapter
    for module in model.modules():
        if isinstance(module, base_tuner):
            for name, p in module.named_parameters():
                if not name.startswith("base_layer.") and ".base_layer." not in name:
                    ids.add(id(p))
    return ids


def _looks_like_adapter(fqn: str) -> bool:
    return any(part.startswith("lora_") or part == "modules_to_save" for part in fqn.split("."))


def _wrap_time_layout(model: nn.Module) -> tuple[set[str], set[str]]:
    """(modules attached after FSDP2 wrapping, modules inside an FSDP2 call's subtree).

    `fully_shard` flags every module its traversal visits with
    `_is_fsdp_managed_module`, except modules whose params were all ignored. So an
    unflagged module that has a flagged descendant was inserted afterwards (as peft
    does when it wraps a Linear), and an unflagged module right under a flagged one
    with no flagged descendant was excluded through `ignored_params`.
    """
    modules = dict(model.named_modules(remove_duplicate=False))
    flagged = {n for n, m in modules.items() if getattr(m, "_is_fsdp_managed_module", False)}
    holds_flagged = set()
    for n in flagged:
        parts = n.split(".") if n else []
        holds_flagged.update(".".join(parts[:i]) for i in range(len(parts)))
    attached_late, inside_unit = set(), set()
    for name in modules:
        if name in flagged:
            continue
        chain, cur = [], name
        while True:
            chain.append(cur)
            if not cur:
                break
            cur = cur.rpartition(".")[0]
            if cur in flagged:
                inside_unit.add(name)
                if any(c in holds_flagged for c in chain):
                    attached_late.add(name)
                break
    return attached_late, inside_unit


def scan_model(model: nn.Module) -> ModelScan:
    managed: dict[int, tuple[str, Optional[str]]] = {}  # id(param) -> (kind, unit fqn)
    replaced_slots: set[tuple[int, str]] = set()  # (id(module), param name) FSDP2 lost track of
    ignored_ids: set[int] = set()
    groups: list[FSDP2Group] = []
    has_fsdp1 = has_fsdp2 = False

    fsdp2_state = _fsdp2_state_type()
    fsdp1 = _fsdp1_type()
    ddp = nn.parallel.DistributedDataParallel
    names = {id(m): clean_fqn(n) for n, m in model.named_modules(remove_duplicate=False)}

    for mod_name, module in model.named_modules():
        unit = clean_fqn(mod_name) or "<root>"
        state = _composable_state(module)
        if fsdp2_state is not None and isinstance(state, fsdp2_state):
            has_fsdp2 = True
            for pg in getattr(state, "_fsdp_param_groups", None) or []:
                group = FSDP2Group(unit=unit)
                for fp in pg.fsdp_params:
                    sharded = fp.sharded_param
                    info = fp._module_info
                    pname = f"{names.get(id(info.module), '?')}.{info.param_name}".lstrip(".")
                    # Between forward and resharding the module holds another FSDP-owned tensor.
                    own = [sharded] + [
                        t
                        for t in (getattr(fp, "_unsharded_param", None), getattr(fp, "_sharded_post_forward_param", None))
                        if t is not None
                    ]
                    current = info.module._parameters.get(info.param_name)
                    if not any(current is t for t in own):
                        replaced_slots.add((id(info.module), info.param_name))
                    for t in own:
                        managed[id(t)] = (FSDP2, unit)
                    if sharded.requires_grad:
                        group.orig_dtypes[pname] = sharded.dtype  # the original dtype, before mixed precision
                groups.append(group)
        elif state is not None and type(state).__name__ == "_ReplicateState":  # DDP-based replicate()
            for p in module.parameters():
                managed.setdefault(id(p), (DDP, unit))
        if isinstance(module, ddp):
            for p in module.parameters():
                managed.setdefault(id(p), (DDP, unit))
        if fsdp1 is not None and isinstance(module, fsdp1):
            has_fsdp1 = True
            handle = getattr(module, "_handle", None)
            flat = getattr(handle, "flat_param", None)
            if flat is not None:
                managed[id(flat)] = (FSDP1, unit)
                for p in (getattr(flat, "_params", None) or []) + (getattr(flat, "_shared_params", None) or []):
                    managed[id(p)] = (FSDP1, unit)
            ignored_ids.update(id(p) for p in getattr(module, "_ignored_params", ()) or ())

    attached_late, inside_unit = _wrap_time_layout(model)
    adapters = _adapter_param_ids(model)
    flat_type = None
    if has_fsdp1:
        from torch.distributed.fsdp._flat_param import FlatParameter as flat_type

    records: list[ParamRecord] = []
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        for pname, p in module._parameters.items():
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            fqn = clean_fqn(f"{mod_name}.{pname}" if mod_name else pname)
            kind, unit = managed.get(id(p), (None, None))
            if kind is None:
                if (id(module), pname) in replaced_slots:
                    kind = REPLACED
                elif _is_dtensor(p):
                    kind = TENSOR_PARALLEL
                elif getattr(p, "_post_accumulate_grad_hooks", None):
                    kind = SYNCED
                elif id(p) in ignored_ids or (mod_name in inside_unit and mod_name not in attached_late):
                    kind = IGNORED
                else:
                    kind = UNMANAGED
            records.append(
                ParamRecord(
                    fqn=fqn,
                    param=p,
                    owner=module,
                    kind=kind,
                    unit=unit,
                    adapter=id(p) in adapters or _looks_like_adapter(fqn),
                    flat=flat_type is not None and isinstance(p, flat_type),
                )
            )
    return ModelScan(records, groups, has_fsdp1, has_fsdp2)


def local_trainable_numel(record: ParamRecord) -> int:
    """Trainable elements this rank holds for one param."""
    p = record.param
    if record.flat:
        infos = getattr(p, "_shard_param_infos", None)
        params = getattr(p, "_params", None)
        if infos is not None and params is not None:  # use_orig_params=True: mixed flat param
            return sum(i.numel_in_shard or 0 for i, q in zip(infos, params) if i.in_shard and q.requires_grad)
    if not p.requires_grad:
        return 0
    return p.to_local().numel() if _is_dtensor(p) else p.numel()


def is_4bit_module(module: nn.Module) -> bool:
    """A bitsandbytes 4-bit linear (or a peft wrapper class derived from one)."""
    if "bitsandbytes" not in sys.modules:
        return False  # nothing can be 4-bit if bitsandbytes was never imported
    return any(
        c.__name__ == "Linear4bit" and c.__module__.startswith("bitsandbytes") for c in type(module).__mro__
    )


def is_params4bit(p: torch.Tensor) -> bool:
    if "bitsandbytes" not in sys.modules:
        return False
    return any(c.__name__ == "Params4bit" for c in type(p).__mro__)
