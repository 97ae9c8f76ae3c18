"""Run one model audit: build on meta, plan FSDP, estimate memory, run the audit rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from fsdplint.audit.spec import AuditSpec, spec_from_dict


@dataclass
class AuditResult:
    spec: AuditSpec
    findings: list
    summary: dict
    coverage: list
    plan: Any
    memory: Any
    torch_version: str
    notes: list[str] = field(default_factory=list)
    torch_version_source: str = ""
    # The audited (meta, sharded for FSDP2) model, for callers that want to look further.
    model: Any = None

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0


def run_audit(spec: AuditSpec, select: Optional[set] = None) -> AuditResult:
    """Audit `spec`; `select` limits the rule codes that may report (None = all)."""
    from fsdplint.audit.build import build_model
    from fsdplint.audit.context import AuditContext
    from fsdplint.audit.env import quiet
    from fsdplint.audit.memory import estimate
    from fsdplint.audit.params import collect_params, mark_ignored
    from fsdplint.registry import all_rules

    built = build_model(spec)
    params = collect_params(built.model, built)
    mark_ignored(params, spec.fsdp.ignored_params)
    wrap = spec.fsdp.wrap if spec.fsdp.wrap is not None else built.no_split_modules
    activations, act_note = _activations(spec, built, wrap)
    with quiet():
        if spec.fsdp.version == 1:
            from fsdplint.audit.plan_fsdp1 import plan_fsdp1

            plan = plan_fsdp1(built.model, params, wrap, spec)
        else:
            from fsdplint.audit.plan_fsdp2 import plan_fsdp2

            plan = plan_fsdp2(built.model, params, wrap, spec)
    memory = estimate(plan, activations=activations, adamw_fused=spec.training.adamw_fused,
                      offload=spec.fsdp.offload_params)
    tv, source = _target_torch(spec)
    ctx = AuditContext(spec=spec, built=built, params=params, plan=plan, memory=memory,
                       torch_version=tv, torch_version_source=source, selected=select)
    for rule in all_rules():
        if rule.has_audit() and (select is None or rule.code in select):
            try:
                rule().audit(ctx)
            except Exception as e:  # one rule's bug must not hide the other rules' findings
                detail = f"{type(e).__name__}: {e}".splitlines()[0]
                ctx.report("FSDP901", f"rule {rule.code} ({rule.name}) failed on this model: {detail}")
    # Errors torch raises come in the order it raises them (each found past the earlier ones).
    raised: dict = {}
    for p in [*built.problems, *plan.problems]:
        raised.setdefault(p.code, len(raised))
    findings = sorted(ctx.findings, key=lambda f: (f.severity.rank, raised.get(f.code, len(raised)), f.code)
                      + (() if f.code in raised else (f.message,)))
    notes = list(dict.fromkeys(spec.input_notes)) + [f"checks target torch {tv} ({source})."]
    if act_note:
        notes.append(act_note)
    from fsdplint.audit.unquantized import unquantized_note

    kept = unquantized_note(params)
    if kept:
        notes.append(kept)
    if plan.version == 1 and plan.executed:
        ranks = "rank 0" + (f" and rank {plan.world_size - 1}" if plan.world_size > 1 else "")
        notes.append(f"FSDP1 plan executed: torch FullyShardedDataParallel (device_id=cpu) on a fake-tensor copy "
                     f"of the model under a fake process group of {plan.world_size} ranks; its flat parameters "
                     f"on {ranks} match the computed plan.")
    elif plan.version == 1:
        why = plan.mismatch or "torch refuses this plan (see the findings)"
        notes.append(f"FSDP1 plan computed with torch's wrap-policy and flattening code, not executed: {why}.")
    else:
        notes.append(f"FSDP2 plan executed: torch fully_shard on the meta model under a fake process group "
                     f"of {plan.world_size} ranks.")
    return AuditResult(spec=spec, findings=findings, summary=_summary(built, params, plan),
                       coverage=built.coverage, plan=plan, memory=memory, torch_version=tv, notes=notes,
                       model=built.model, torch_version_source=source)


def audit_from_dicts(model: Any, *, lora: Optional[dict] = None, quantization: Optional[dict] = None,
                     fsdp: Optional[dict] = None, dtype: Optional[str] = None,
                     gpu_memory: Any = None, filename: str = "<audit>",
                     locations: Optional[dict] = None, select: Optional[set] = None) -> AuditResult:
    """Audit from plain values, e.g. literals the static analysis found in a training script.

    `model` is a config path, a config dict or {"factory": "module:function"}; `locations`
    maps fields such as "lora.target_modules" to (row, col) so findings point at the script.
    """
    from pathlib import Path

    data = {"model": model}
    for key, value in (("lora", lora), ("quantization", quantization), ("fsdp", fsdp), ("dtype", dtype),
                       ("gpu_memory", gpu_memory)):
        if value is not None:
            data[key] = value
    base = Path(model).parent if isinstance(model, str) else Path.cwd()
    spec = spec_from_dict(data, filename=filename, base_dir=base, locations=locations)
    return run_audit(spec, select=select)


def _activations(spec: AuditSpec, built, wrap: list[str]):
    """The activation estimate for `spec.training`, or (None, why not). Runs before FSDP touches the model."""
    t = spec.training
    if not t.seq_len:
        return None, ""
    from fsdplint.audit.activations import estimate_activations
    from fsdplint.audit.env import quiet

    try:
        with quiet():
            model, cast = _compute_dtype_model(built.model, spec)
            est = estimate_activations(model, wrap, seq_len=t.seq_len, micro_batch=t.micro_batch,
                                       checkpointing=t.activation_checkpointing)
            est.compute_dtype = cast
            return est, ""
    except Exception as e:  # a model whose forward cannot run on meta: say so, audit the rest
        from fsdplint.audit.build import _one_line

        return None, (f"activations not estimated: the model's forward+backward did not run on the meta "
                      f"device ({type(e).__name__}: {_one_line(e)[:200]}).")


def _compute_dtype_model(model, spec: AuditSpec):
    """With a mixed-precision param dtype FSDP computes in it: a meta copy cast to it (4-bit weights as
    they are), else the model itself."""
    import copy

    from fsdplint.audit.build import torch_dtype

    name = (spec.fsdp.mixed_precision or {}).get("param_dtype")
    dtype = torch_dtype(name)
    floats = [p for p in model.parameters() if p.is_floating_point() and type(p).__name__ != "Params4bit"]
    if dtype is None or all(p.dtype == dtype for p in floats):
        return model, None
    keep = {id(p): p for p in model.parameters() if type(p).__name__ == "Params4bit"}
    twin = copy.deepcopy(model, keep)
    for p in twin.parameters():
        if p.is_floating_point() and type(p).__name__ != "Params4bit":
            p.data = p.data.to(dtype)
    return twin, name


def _target_torch(spec: AuditSpec) -> tuple[str, str]:
    """The torch version the checks target, and where it came from (as on the static side)."""
    if spec.fsdp.torch:
        return spec.fsdp.torch, "from the audit spec"
    from pathlib import Path

    from fsdplint.versions import resolve

    path = spec.version_path
    if path is None and Path(spec.filename).is_file():
        path = Path(spec.filename)
    tv = resolve("torch", path, spec.target_versions, spec.config_targets, spec.config_source)
    return str(tv.version), tv.source


def _summary(built, params, plan) -> dict:
    from fsdplint.audit.params import dtype_name

    total = sum(p.numel for p in params)
    trainable = sum(p.numel for p in params if p.requires_grad)
    return {
        "architecture": built.architecture,
        "dtype": dtype_name(built.dtype),
        "quantization": built.quantized,
        "quant_storage": dtype_name(built.quant_storage) if built.quant_storage is not None else None,
        "lora": built.lora_applied,
        "params": total,
        "trainable_params": trainable,
        "trainable_percent": 100.0 * trainable / total if total else 0.0,
        "peft_trainable_params": built.peft_trainable,
        "fsdp_version": plan.version,
        "world_size": plan.world_size,
        "wrap_classes": plan.wrap_classes,
        "units": len(plan.units),
    }
