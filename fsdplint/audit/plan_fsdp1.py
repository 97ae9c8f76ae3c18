"""The FSDP1 plan: computed with torch's own wrap-policy and flattening code, then executed.

The plan is derived the way `FullyShardedDataParallel.__init__` derives it: the auto-wrap
policy picks the units (`_Policy._run_policy`, or `_recursive_wrap` for callable policies such
as peft's `fsdp_auto_wrap_policy`), each unit claims its not-yet-claimed parameters in
post-order into one flat parameter, and FSDP1's own checks run on each flat parameter. Those
checks give torch's errors as findings.

When torch accepts the plan, `FullyShardedDataParallel` itself then runs on a copy of the model
(`device_id=cpu`, parameters as fake CPU tensors: no memory) under a fake process group, as
rank 0 and as the last rank, and the real FlatParameters it builds must match the computed
units: same parameters, same padded shard, same real elements, same tensors with optimizer state.
"""

from __future__ import annotations

import contextlib
import functools
import os
import types

from fsdplint.audit.build import _one_line
from fsdplint.audit.params import ParamInfo
from fsdplint.audit.plan import Plan, PlanProblem, Unit, wrap_modules
from fsdplint.audit.spec import AuditSpec


@contextlib.contextmanager
def _wrap_env(classes: list[str]):
    """peft's `fsdp_auto_wrap_policy` reads the classes to wrap from the environment (as accelerate sets it)."""
    old = os.environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP")
    os.environ["FSDP_TRANSFORMER_CLS_TO_WRAP"] = ",".join(classes)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FSDP_TRANSFORMER_CLS_TO_WRAP", None)
        else:
            os.environ["FSDP_TRANSFORMER_CLS_TO_WRAP"] = old


def _units_from_policy(model, wrap_classes, spec: AuditSpec, ignored_params) -> tuple[set, list[str]]:
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, _recursive_wrap, size_based_auto_wrap_policy

    policy_name = spec.fsdp.auto_wrap_policy
    unmatched: list[str] = []
    if policy_name == "none":
        return set(), unmatched
    if policy_name == "transformer":
        mods, unmatched = wrap_modules(model, wrap_classes)
        classes = {type(m) for _, m in mods}
        return set(ModuleWrapPolicy(classes)._run_policy(model, set(), {}).keys()), unmatched
    if policy_name == "peft":
        from peft.utils.other import fsdp_auto_wrap_policy

        mods, unmatched = wrap_modules(model, wrap_classes)
        if not mods:  # peft raises TypeError("Could not find the transformer layer class ..."): FSDP003
            return set(), unmatched
        with _wrap_env([c for c in wrap_classes if c not in unmatched]):
            policy = fsdp_auto_wrap_policy(model)
    else:
        policy = functools.partial(size_based_auto_wrap_policy, min_num_params=spec.fsdp.min_num_params)
    chosen = []

    def record(module, **kwargs):  # stands in for the FSDP wrapper class: wraps nothing
        chosen.append(module)
        return module

    _recursive_wrap(model, policy, record, ignored_modules=set(), ignored_params=ignored_params,
                    only_wrap_children=True)
    return set(chosen), unmatched


def plan_fsdp1(model, params: list[ParamInfo], wrap_classes: list[str], spec: AuditSpec) -> Plan:
    import torch
    from torch.distributed.fsdp._flat_param import FlatParamHandle
    from torch.distributed.fsdp._wrap_utils import _get_managed_param_to_fqn, _get_post_order_named_modules

    ws = spec.fsdp.world_size
    use_orig = spec.fsdp.use_orig_params
    info_of = {id(p.obj): p for p in params}
    ignored = [p for p in params if p.ignored]
    ignored_objs = {p.obj for p in ignored}
    chosen, unmatched = _units_from_policy(model, wrap_classes, spec, ignored_objs)
    chosen.add(model)  # the root is always a unit

    units, claimed = [], set()
    managed_by: dict[int, list[str]] = {}
    visited: set = set()
    for mname, mod in _get_post_order_named_modules(model):
        if mod not in chosen:
            continue
        param_to_fqn = _get_managed_param_to_fqn(mod, ignored_objs, visited, mname)
        unit = Unit(name=mname, cls=type(mod).__name__, params=[])
        # The flat parameter follows `module.parameters()` order (FSDP1's `_get_orig_params`).
        managed = {id(p) for p in param_to_fqn}
        for p in mod.parameters():
            if id(p) not in managed:
                continue
            managed_by.setdefault(id(p), []).append(unit.label)
            if id(p) in claimed:  # already flattened into an inner unit
                continue
            claimed.add(id(p))
            unit.params.append(info_of[id(p)])
        _account(unit, ws, use_orig, spec)
        units.append(unit)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    spec_fp32 = [k for attr in ("_keep_in_fp32_modules_strict", "_keep_in_fp32_modules")
                 for k in (getattr(base, attr, None) or [])]
    problems = _check_units(units, use_orig, spec, model_dtype(params), FlatParamHandle, torch,
                            keep_fp32=(type(base).__name__, spec_fp32))
    order = {n: i for i, (n, _) in enumerate(model.named_modules())}
    units.sort(key=lambda u: order.get(u.name, -1))
    split = [(info_of[i], holders) for i, holders in managed_by.items() if len(holders) > 1]
    mp = spec.fsdp.mixed_precision or {}
    from fsdplint.audit.build import torch_dtype

    executed, mismatch = False, None
    if not problems:
        mismatch = _execute(model, units, ignored, wrap_classes, unmatched, spec)
        executed = mismatch is None
    return Plan(
        version=1, world_size=ws, executed=executed, units=units, wrap_classes=list(wrap_classes),
        wrap_unmatched=unmatched, ignored=ignored, unmanaged=[], split_shared=split, problems=problems,
        param_dtype=torch_dtype(mp.get("param_dtype")), reduce_dtype=torch_dtype(mp.get("reduce_dtype")),
        use_orig_params=use_orig, policy=spec.fsdp.auto_wrap_policy, mismatch=mismatch,
    )


def _execute(model, units: list[Unit], ignored: list[ParamInfo], wrap_classes, unmatched, spec: AuditSpec):
    """Build the real FSDP1 wrapper on a fake-tensor copy of `model`; None when it matches `units`,
    else what differs (or why it could not run)."""
    import copy

    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

    from fsdplint.audit.build import torch_dtype
    from fsdplint.audit.plan_fsdp2 import fake_process_group

    ws = spec.fsdp.world_size
    by_name = {}
    for u in units:
        for p in u.params:
            for n in (p.fqn, *p.aliases):
                by_name[n] = p
    ranks = sorted({0, ws - 1})
    try:
        for rank in ranks:
            # A 4-bit weight becomes what FSDP1 sees once loaded: its packed storage, not the meta
            # shape (and bnb's Params4bit cannot be deep-copied on meta).
            memo = {id(p.obj): torch.nn.Parameter(torch.empty((p.storage_numel, 1), dtype=p.storage_dtype,
                                                              device="meta"), requires_grad=False)
                    for p in [q for u in units for q in u.params] + ignored if p.kind == "4bit"}
            twin = copy.deepcopy(model, memo)
            twin_of = dict(zip((id(p) for p in model.parameters()), twin.parameters()))
            fake_process_group(ws, rank)
            with FakeTensorMode(allow_non_fake_inputs=True):
                twin.to_empty(device="cpu")
                kwargs = {"device_id": torch.device("cpu"), "use_orig_params": spec.fsdp.use_orig_params,
                          "ignored_states": [twin_of[id(p.obj)] for p in ignored] or None}
                mp = spec.fsdp.mixed_precision or {}
                if mp:
                    kwargs["mixed_precision"] = MixedPrecision(param_dtype=torch_dtype(mp.get("param_dtype")),
                                                               reduce_dtype=torch_dtype(mp.get("reduce_dtype")))
                policy = spec.fsdp.auto_wrap_policy
                if policy == "transformer":
                    classes = {type(m) for m in twin.modules() if type(m).__name__ in set(wrap_classes)}
                    kwargs["auto_wrap_policy"] = ModuleWrapPolicy(classes)
                elif policy == "size":
                    kwargs["auto_wrap_policy"] = functools.partial(size_based_auto_wrap_policy,
                                                                   min_num_params=spec.fsdp.min_num_params)
                if policy == "peft":
                    from peft.utils.other import fsdp_auto_wrap_policy

                    with _wrap_env([c for c in wrap_classes if c not in unmatched]):
                        kwargs["auto_wrap_policy"] = fsdp_auto_wrap_policy(twin)
                wrapped = FSDP(twin, **kwargs)
            diff = _compare(wrapped, units, by_name, rank)
            if diff:
                return diff
    except Exception as e:  # torch refused something the computed plan accepted: keep the computed plan
        return f"FullyShardedDataParallel raised {type(e).__name__}: {_one_line(e)}"
    finally:
        if dist.is_initialized() and dist.get_rank() != 0:
            fake_process_group(ws, 0)
    return None


def _compare(wrapped, units: list[Unit], by_name: dict, rank: int):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    by_label = {u.name: u for u in units}
    seen = set()
    for name, mod in wrapped.named_modules():
        if not isinstance(mod, FSDP) or mod._handle is None:
            continue
        label = name.replace("_fsdp_wrapped_module.", "").replace("._fsdp_wrapped_module", "")
        label = "" if label == "_fsdp_wrapped_module" else label
        unit = by_label.get(label)
        flat = mod._handle.flat_param
        members = {id(by_name.get(f"{label}.{f}" if label else f)) for f in flat._fqns}
        if unit is None or members != {id(p) for p in unit.params}:
            return f"unit {label or '(root)'}: FSDP1 flattened other parameters than computed"
        seen.add(label)
        item = flat.dtype.itemsize
        chunk = flat.numel()
        real = sum(info.numel_in_shard or 0 for info in flat._shard_param_infos if info.in_shard)
        if flat._params is not None:  # use_orig_params: the originals with elements in this shard
            tensors = sum(1 for p, info in zip(flat._params, flat._shard_param_infos)
                          if info.in_shard and p.requires_grad)
        else:
            tensors = int(flat.requires_grad)
        got = (chunk * item, real * item, tensors)
        want = (unit.param_bytes[rank], unit.local_param_bytes[rank], unit.trainable_tensors[rank])
        if got != want:
            return (f"unit {unit.label} on rank {rank}: FlatParameter shard {got[0]} B ({got[1]} B real, "
                    f"{got[2]} tensors with optimizer state), computed {want[0]} B ({want[1]} B, {want[2]})")
    missing = [u.label for u in units if u.params and u.name not in seen]
    if missing:
        return f"unit {missing[0]}: FSDP1 built no flat parameter for it"
    return None


def model_dtype(params: list[ParamInfo]):
    """The dtype most of the model's floating parameters have (what a fix casts to)."""
    counts: dict = {}
    for p in params:
        if p.dtype.is_floating_point and not p.kind:
            counts[p.dtype] = counts.get(p.dtype, 0) + p.numel
    return max(counts, key=counts.get) if counts else None


def _check_units(units: list[Unit], use_orig: bool, spec: AuditSpec, dtype, FlatParamHandle, torch,
                 keep_fp32=("", [])) -> list:
    """Every error FSDP1's constructor raises on this plan, in the order it raises them.

    torch checks requires_grad over all units first (`_validate_frozen_params` in `_auto_wrap`,
    torch/distributed/fsdp/_wrap_utils.py), then flattens unit by unit in post-order
    (`FlatParamHandle._validate_tensors_to_flatten`, torch/distributed/fsdp/_flat_param.py). Past
    each failure the check goes on with a copy of the unit that assumes that failure fixed, so the
    user learns every fix in one run.
    """
    problems = []
    frozen_mix = set()
    for unit in units:  # post-order, as torch walks them
        frozen = [p for p in unit.params if not p.requires_grad]
        trainable = [p for p in unit.params if p.requires_grad]
        if frozen and trainable and not use_orig:
            frozen_mix.add(unit.label)
            problems.append(PlanProblem(
                "FSDP004",
                f"{unit.label} has both parameters with requires_grad=True and False. FSDP does not "
                f"support wrapping such modules when use_orig_params=False. If possible, wrap the frozen "
                f"parameters with FSDP separately.",
                unit.label,
            ))
    for unit in units:
        after = ("FSDP004",) if unit.label in frozen_mix else ()
        problems.extend(_flatten_checks(unit, use_orig, spec, dtype, after, FlatParamHandle, torch, keep_fp32))
    return problems


def _flatten_checks(unit: Unit, use_orig: bool, spec: AuditSpec, dtype, after: tuple, FlatParamHandle, torch,
                    keep_fp32=("", [])):
    if not unit.params:
        return []
    # Stand-ins with the dtype the loaded weights will have (4-bit: the quant storage dtype). Past
    # FSDP004 requires_grad is taken as uniform (the unit's frozen weights wrapped apart).
    uniform_grad = bool(after) and not use_orig
    dtypes = [p.storage_dtype for p in unit.params]
    handle = types.SimpleNamespace(_use_orig_params=use_orig)
    out = []
    for _ in range(4):  # each pass fixes one failure; there are at most three kinds
        stand_ins = []
        for p, dt in zip(unit.params, dtypes):
            t = torch.empty(0, dtype=dt, device="meta")
            if t.is_floating_point() and (p.requires_grad or (uniform_grad and any(q.requires_grad for q in unit.params))):
                t.requires_grad_(True)
            stand_ins.append(t)
        try:
            FlatParamHandle._validate_tensors_to_flatten(handle, stand_ins)
            return out
        except ValueError as e:
            text = _one_line(e)
        problem, fixed = _classify(unit, dtypes, text, spec, dtype, torch, keep_fp32)
        problem.after = after + tuple(p.code for p in out if p.code not in after)
        out.append(problem)
        if fixed is None:
            return out
        dtypes = fixed
    return out


def _classify(unit: Unit, dtypes: list, text: str, spec: AuditSpec, dtype, torch, keep_fp32=("", [])):
    """(problem, the unit's dtypes with it fixed or None) for one `_validate_tensors_to_flatten` error."""
    from fsdplint.audit.params import dtype_name

    msg = f"{unit.label}: {text}"
    if "requires_grad" in text:
        return PlanProblem("FSDP004", msg, unit.label), None
    four = [i for i, p in enumerate(unit.params) if p.kind == "4bit"]
    eight = [i for i, p in enumerate(unit.params) if p.kind == "8bit"]
    target = dtype or next((d for d in dtypes if d.is_floating_point), torch.float32)
    # The first dtype mismatch or integer tensor, as torch walks the list.
    first = dtypes[0]
    bad = 0 if not first.is_floating_point else next((i for i, d in enumerate(dtypes) if d != first), None)
    if eight and bad in eight + [0]:
        return PlanProblem("FSDP202", msg, unit.label,
                           cause="bitsandbytes 8-bit weights are int8: FSDP1 cannot flatten them at all."), None
    storage_side = bad is not None and (bad in four or (bad > 0 and 0 in four))
    if four and storage_side and any(dtypes[i] != target for i in four):
        fixed = [target if i in four else d for i, d in enumerate(dtypes)]
        return PlanProblem(
            "FSDP202", msg, unit.label,
            cause=f"The 4-bit weights are stored as {dtype_name(dtypes[four[0]])}; set bnb_4bit_quant_storage="
                  f"{dtype_name(target)} (the model dtype) so every flat parameter has one floating dtype."), fixed
    lora = [i for i, p in enumerate(unit.params) if p.adapter_dtype is not None or _is_adapter(p)]
    upcast = [i for i in lora if dtypes[i] == torch.float32 and target in (torch.bfloat16, torch.float16)]
    if upcast and (bad in upcast or 0 in upcast):
        fixed = [target if i in upcast else d for i, d in enumerate(dtypes)]
        before, why = unit.params[upcast[0]].adapter_dtype or (None, "")
        t = dtype_name(target)
        own_units = "or wrap the LoRA layers in units of their own (peft's fsdp_auto_wrap_policy)."
        if before in (torch.bfloat16, torch.float16) and spec.autocast_adapter_dtype:
            cause = (f"The float32 parameters are the LoRA adapters: peft's get_peft_model(autocast_adapter_dtype="
                     f"True, the default) upcasts {dtype_name(before)} adapter weights to float32 next to the {t} "
                     f"base. Pass get_peft_model(..., autocast_adapter_dtype=False), cast the PEFT model to {t} "
                     f"before wrapping, {own_units}")
        elif before == torch.float32 and "compute dtype" in why:
            cause = (f"The float32 parameters are the LoRA adapters: peft creates them in {why}, float32 by default. "
                     f"Set bnb_4bit_compute_dtype={t}"
                     + (" and pass get_peft_model(..., autocast_adapter_dtype=False)" if spec.autocast_adapter_dtype
                        else "") + f", {own_units}")
        else:
            cause = f"The float32 parameters are the LoRA adapters: cast the PEFT model to {t} before wrapping, {own_units}"
        return PlanProblem("FSDP005", msg, unit.label, cause=cause), fixed
    fixed = [target if d.is_floating_point or i in four else d for i, d in enumerate(dtypes)]
    cls, keys = keep_fp32
    kept = [unit.params[i].fqn[len(unit.name) + 1 if unit.name else 0:] for i, d in enumerate(dtypes) if d == torch.float32 and d != target
            and any(k in unit.params[i].fqn for k in keys)]
    if kept:
        return PlanProblem(
            "FSDP005", msg, unit.label,
            cause=f"The float32 parameters (the unit's {kept[0]}{', ...' if len(kept) > 1 else ''}) are ones transformers "
                  f"keeps in float32 ({cls}._keep_in_fp32_modules: {', '.join(keys)}); casting them down changes "
                  f"the model. Give those modules FSDP units of their own (add their class to the wrap list), "
                  f"or shard with FSDP2 (fully_shard, torch >= 2.8 accepts frozen parameters of another dtype)."), fixed
    if fixed == dtypes:
        return PlanProblem("FSDP005", msg, unit.label), None
    return PlanProblem("FSDP005", msg, unit.label), fixed


def _is_adapter(p: ParamInfo) -> bool:
    return any(f".{k}." in f".{p.fqn}." for k in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B",
                                                    "lora_magnitude_vector"))


def _account(unit: Unit, ws: int, use_orig: bool, spec: AuditSpec) -> None:
    """Lay the unit's params out in one flat parameter and split it into `ws` equal chunks."""
    ranges = []  # (start, end, requires_grad, itemsize)
    total = 0
    for p in unit.params:
        item = p.storage_dtype.itemsize
        if use_orig and total % max(1, 16 // item):
            # use_orig_params=True aligns each original parameter to 16 bytes.
            total += max(1, 16 // item) - total % max(1, 16 // item)
        ranges.append((total, total + p.storage_numel, p.requires_grad, item))
        total += p.storage_numel
    chunk = -(-total // ws) if total else 0
    item = unit.params[0].storage_dtype.itemsize if unit.params else 0
    any_trainable = any(p.requires_grad for p in unit.params)
    unit.param_bytes = [chunk * item] * ws
    # Parameter elements only: the alignment (use_orig_params) and end padding are "shard padding".
    unit.local_param_bytes = [sum(max(0, min((r + 1) * chunk, e) - max(r * chunk, s)) for s, e, _, _ in ranges)
                              * item for r in range(ws)]
    unit.quant_bytes = [0] * ws
    unit.trainable_elems, unit.trainable_bytes, unit.trainable_tensors = [], [], []
    for r in range(ws):
        lo, hi = r * chunk, (r + 1) * chunk
        parts = [max(0, min(hi, e) - max(lo, s)) for s, e, rg, _ in ranges if rg]
        elems = sum(parts)
        unit.trainable_elems.append(elems)
        # AdamW keeps exp_avg/exp_avg_sq shaped like what it is given: the whole padded shard of a
        # trainable FlatParameter, or (use_orig_params) the views of the original parameters.
        unit.trainable_bytes.append(elems * item if use_orig else (chunk * item if any_trainable else 0))
        # The optimizer sees one FlatParameter per unit; with use_orig_params the original
        # parameters, of which those with no element in this rank's shard get no gradient
        # (`_use_sharded_grad_views`) and so no optimizer state.
        unit.trainable_tensors.append(sum(1 for n in parts if n) if use_orig else int(any_trainable))
    # One FlatParameter has one .grad: with any trainable param the whole shard gets a gradient.
    unit.grad_bytes = [chunk * item if any_trainable else 0] * ws
    mp = spec.fsdp.mixed_precision or {}
    cdt = mp.get("param_dtype")
    citem = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}.get(cdt, item) if cdt else item
    unit.unsharded_bytes = chunk * ws * (citem if any(p.storage_dtype.is_floating_point for p in unit.params) else item)
