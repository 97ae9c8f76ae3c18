"""Run the real FSDP2 `fully_shard` on the meta model under a fake process group."""

from __future__ import annotations

from fsdplint.audit.build import _one_line, torch_dtype
from fsdplint.audit.params import ParamInfo
from fsdplint.audit.plan import Plan, PlanProblem, Unit, chunk_rows, wrap_modules
from fsdplint.audit.spec import AuditInputError, AuditSpec

# torch's error texts → the rule that explains them.
_ERROR_CODES = (
    ("ignored_params", "FSDP001"),
    ("uniform original parameter dtype", "FSDP005"),
    ("uniform reduce dtype", "FSDP005"),
    ("shared with a parameter already managed", "FSDP006"),
    ("floating point dtype can require gradients", "FSDP201"),
)


def fake_process_group(world_size: int, rank: int = 0) -> None:
    """A `fake` backend default group of `world_size` ranks, this process being `rank`."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_backend() != "fake":
            raise AuditInputError("a real torch.distributed process group is already initialised; "
                                  "run the model audit in its own process")
        if dist.get_world_size() == world_size and dist.get_rank() == rank:
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())


def plan_fsdp2(model, params: list[ParamInfo], wrap_classes: list[str], spec: AuditSpec) -> Plan:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    ws = spec.fsdp.world_size
    fake_process_group(ws)
    mesh = init_device_mesh("cpu", (ws,))
    mp = spec.fsdp.mixed_precision or {}
    kwargs = {"mesh": mesh}
    if mp:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch_dtype(mp.get("param_dtype")),
                                                   reduce_dtype=torch_dtype(mp.get("reduce_dtype")))
    if spec.fsdp.reshard_after_forward is not None:
        kwargs["reshard_after_forward"] = spec.fsdp.reshard_after_forward
    ignored = [p for p in params if p.ignored]
    if ignored:
        kwargs["ignored_params"] = {p.obj for p in ignored}
    by_slot = {}
    for info in params:
        for owner in info.owners:
            by_slot[owner] = info
    module_fqn = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}

    targets, unmatched = wrap_modules(model, wrap_classes)
    if spec.fsdp.shard_root:
        targets.append(("", model))
    problems: list[PlanProblem] = []
    sharded = []
    for name, mod in targets:
        cls = type(mod).__name__  # fully_shard swaps the class for FSDP<cls>
        try:
            fully_shard(mod, **kwargs)
        except Exception as e:  # torch's refusal is the finding
            problems.append(_problem(e, name))
            continue
        sharded.append((name, mod, cls))

    units = []
    order = {n: i for i, (n, _) in enumerate(model.named_modules())}
    sharded.sort(key=lambda t: order.get(t[0], -1))
    for name, mod, cls in sharded:
        state = mod._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:  # torch < 2.13: one group per state
            groups = [g for g in [state._fsdp_param_group] if g is not None]
        unit = Unit(name=name, cls=cls, params=[])
        for attr in ("param_bytes", "local_param_bytes", "quant_bytes", "trainable_elems",
                     "trainable_bytes", "grad_bytes", "trainable_tensors"):
            setattr(unit, attr, [0] * ws)
        for group in groups:
            try:
                # torch's own lazy-init dtype check (runs at the first forward otherwise).
                group._init_mp_dtypes()
            except AssertionError as e:
                problems.append(PlanProblem("FSDP005", _one_line(e), name))
            for fp in group.fsdp_params:
                mi = fp._module_info
                info = by_slot.get((module_fqn.get(id(mi.module), "?"), mi.param_name))
                if info is None:
                    continue
                unit.params.append(info)
                _account(unit, info, fp, ws, mp)
        units.append(unit)

    managed = {id(p) for u in units for p in u.params}
    split = []
    for info in params:
        holders = [u.label for u in units if any(p is info for p in u.params)]
        if len(holders) > 1:
            split.append((info, holders))
    unmanaged = [p for p in params if id(p) not in managed and not p.ignored]
    return Plan(
        version=2, world_size=ws, executed=True, units=units, wrap_classes=list(wrap_classes),
        wrap_unmatched=unmatched, ignored=ignored, unmanaged=unmanaged, split_shared=split,
        problems=problems, param_dtype=torch_dtype(mp.get("param_dtype")),
        reduce_dtype=torch_dtype(mp.get("reduce_dtype")),
    )


def _problem(e: Exception, unit: str) -> PlanProblem:
    msg = _one_line(e)
    for needle, code in _ERROR_CODES:
        if needle in msg:
            return PlanProblem(code, f"fully_shard raised {type(e).__name__}: {msg}", unit)
    raise AuditInputError(f"torch fully_shard failed on {unit or 'the root'}: {type(e).__name__}: {msg}")


def _account(unit: Unit, info: ParamInfo, fp, ws: int, mp: dict) -> None:
    """Per-rank bytes of one managed parameter, from the real sharded DTensor."""
    local = fp.sharded_param.to_local()
    rows = info.shape[0] if info.shape else 1
    per, real = chunk_rows(rows, ws)
    row_numel = info.numel // rows if rows else 0
    if info.kind == "4bit":
        # On meta a Params4bit is still unquantized: count the packed storage it has once
        # loaded, sharded the same way (computed, not read off the meta tensor).
        srows = info.storage_numel
        sper, sreal = chunk_rows(srows, ws)
        item = info.storage_dtype.itemsize
        alloc = [sper * item] * ws
        elems = [n for n in sreal]
        unsharded = sper * ws * item
    else:
        item = local.element_size()
        alloc = [fp._sharded_param_data.numel() * item] * ws  # padded to `per` rows on every rank
        elems = [r * row_numel for r in real]
        cdt = torch_dtype(mp.get("param_dtype")) if mp.get("param_dtype") and info.dtype.is_floating_point else None
        unsharded = per * ws * row_numel * (cdt.itemsize if cdt else item)
        unit.local_bytes = (unit.local_bytes or 0) + local.numel() * item
    quant = info.kind == "4bit"
    for r in range(ws):
        if quant:
            unit.quant_bytes[r] += alloc[r]
        else:
            unit.param_bytes[r] += alloc[r]
            unit.local_param_bytes[r] += real[r] * row_numel * item
        if info.requires_grad:
            unit.trainable_elems[r] += elems[r]
            unit.trainable_bytes[r] += elems[r] * item
            unit.grad_bytes[r] += elems[r] * item
            # Every rank's optimizer sees every trainable DTensor (empty local shards too).
            unit.trainable_tensors[r] += 1
    unit.unsharded_bytes += unsharded
