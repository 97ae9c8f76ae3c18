"""Per-rank checks on a scanned model and its optimizer (no communication)."""

from __future__ import annotations

from fsdplint.findings import Finding
from fsdplint.runtime import units
from fsdplint.runtime.codes import make_finding
from fsdplint.runtime.units import ModelScan, ParamRecord


def _examples(items, limit: int = 3) -> str:
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def unmanaged_findings(scan: ModelScan) -> list[Finding]:
    """FSDP101 / FSDP016 / FSDP001: trainable params whose gradients FSDP never reduces."""
    if not scan.wrapped:
        return []  # not wrapped (yet): nothing is supposed to be managed
    lora, replaced, ignored, unmanaged = [], [], [], []
    for r in scan.params:
        if not r.trainable:
            continue
        if r.kind == units.REPLACED:
            replaced.append(r)
        elif r.kind == units.IGNORED:
            ignored.append(r)  # adapters included: excluded at wrap time, not injected late
        elif r.kind == units.UNMANAGED:
            (lora if r.adapter else unmanaged).append(r)
    out = []
    if lora:
        out.append(
            make_finding(
                "FSDP101",
                f"{_count(len(lora), 'trainable adapter param')} not managed by FSDP "
                f"({_examples(r.fqn for r in lora)}): the adapter was injected after the model was wrapped, "
                "so its gradients are never reduced and every rank trains its own copy. "
                "Call get_peft_model() before fully_shard()/FSDP(), then build the optimizer.",
            )
        )
    if replaced:
        out.append(
            make_finding(
                "FSDP016",
                f"{_count(len(replaced), 'trainable param')} re-created after FSDP sharded the originals "
                f"({_examples(r.fqn for r in replaced)}): the new tensors are in no FSDP unit, their "
                "gradients are never reduced and ranks diverge. Replace or reassign parameters before "
                "wrapping.",
            )
        )
    if unmanaged:
        out.append(
            make_finding(
                "FSDP016",
                f"{_count(len(unmanaged), 'trainable param')} outside every FSDP unit "
                f"({_examples(r.fqn for r in unmanaged)}): their gradients are never reduced, so ranks "
                "diverge. Create them before wrapping, or let the root fully_shard()/FSDP() call cover "
                "their module.",
            )
        )
    if ignored:
        out.append(
            make_finding(
                "FSDP001",
                f"{_count(len(ignored), 'trainable param')} excluded from FSDP "
                f"({_examples(r.fqn for r in ignored)}), through ignored_params (or attached to a "
                "sharded module after wrapping): they are neither sharded nor gradient-reduced, so each "
                "rank trains its own copy. Ignore only frozen params (requires_grad=False), or let FSDP "
                "manage these.",
            )
        )
    return out


def mixed_dtype_findings(scan: ModelScan) -> list[Finding]:
    """FSDP005: an FSDP2 group whose trainable params differ in dtype (fails at the first forward)."""
    out = []
    for g in scan.fsdp2_groups:
        dtypes = sorted({str(d).replace("torch.", "") for d in g.orig_dtypes.values()})
        if len(dtypes) > 1:
            per = {}
            for fqn, d in g.orig_dtypes.items():
                per.setdefault(str(d).replace("torch.", ""), fqn)
            sample = ", ".join(f"{fqn} is {d}" for d, fqn in sorted(per.items()))
            out.append(
                make_finding(
                    "FSDP005",
                    f"FSDP unit {g.unit} mixes trainable dtypes {{{', '.join(dtypes)}}} ({sample}): FSDP2 "
                    "needs one original dtype per unit and fails at the first forward. Cast the model to "
                    "one dtype before fully_shard() (e.g. model.to(torch.bfloat16) after get_peft_model), "
                    "or shard the adapter in its own unit.",
                )
            )
    return out


def quantized_findings(scan: ModelScan) -> list[Finding]:
    """FSDP201: bitsandbytes 4-bit weights inside an FSDP2 unit."""
    hits: list[ParamRecord] = []
    for r in scan.params:
        if r.kind != units.FSDP2:
            continue
        owner_4bit = units.is_4bit_module(r.owner) and r.fqn.rsplit(".", 1)[-1] == "weight"
        if owner_4bit or units.is_params4bit(r.param):
            hits.append(r)
    if not hits:
        return []
    return [
        make_finding(
            "FSDP201",
            f"FSDP2 sharded {_count(len(hits), 'bitsandbytes 4-bit weight')} "
            f"({_examples(r.fqn for r in hits)}): fully_shard turns Params4bit into plain DTensors and "
            "drops their quantization state: bitsandbytes >= 0.44 restores it from the module in forward (measured "
            "correct on CPU with 0.50.2), older releases and CUDA/NCCL paths are not shown safe. Pass the frozen "
            "4-bit weights in ignored_params (torch >= 2.7; accelerate >= 1.14 does this), or use FSDP1 "
            "with bnb_4bit_quant_storage equal to the model dtype.",
        )
    ]


def optimizer_findings(scan: ModelScan, optimizer) -> list[Finding]:
    """FSDP102: the optimizer holds tensors the model no longer uses."""
    if optimizer is None:
        return []
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise TypeError(f"fsdplint.check: optimizer {type(optimizer).__name__} has no param_groups")
    model_ids = {id(r.param) for r in scan.params}
    held = [p for g in groups for p in g.get("params", ())]
    stale = [p for p in held if id(p) not in model_ids]
    if not stale:
        return []
    held_ids = {id(p) for p in held}
    untracked = [r for r in scan.params if r.trainable and id(r.param) not in held_ids]
    shapes = _examples(str(tuple(p.shape)) for p in stale)
    missing = (
        f"; {_count(len(untracked), 'trainable model param')} ({_examples(r.fqn for r in untracked)}) "
        "will never be updated"
        if untracked
        else ""
    )
    return [
        make_finding(
            "FSDP102",
            f"the optimizer holds {_count(len(stale), 'tensor')} that the model no longer has "
            f"(shapes {shapes}){missing}: it was built before FSDP replaced the parameters, so "
            "optimizer.step() updates stale copies. Build the optimizer after wrapping (or pass model "
            "and optimizer together to accelerator.prepare).",
        )
    ]


def local_findings(scan: ModelScan, optimizer) -> list[Finding]:
    return (
        unmanaged_findings(scan)
        + mixed_dtype_findings(scan)
        + quantized_findings(scan)
        + optimizer_findings(scan, optimizer)
    )
