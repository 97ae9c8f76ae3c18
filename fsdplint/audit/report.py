"""Render an AuditResult: rich tables for people, json (the static side's findings schema) for tools."""

from __future__ import annotations

import json
from typing import IO

from fsdplint.audit.memory import fmt_bytes
from fsdplint.audit.params import dtype_name


def _unit_row(unit, plan) -> dict:
    dtypes = sorted({dtype_name(p.storage_dtype) for p in unit.params})
    rg = {p.requires_grad for p in unit.params}
    return {
        "unit": unit.label,
        "class": unit.cls,
        "params": unit.numel,
        "trainable_params": sum(p.numel for p in unit.params if p.requires_grad),
        "dtypes": dtypes,
        "requires_grad": "mixed" if len(rg) > 1 else ("trainable" if rg == {True} else "frozen") if rg else "-",
        "quantized_params": sum(1 for p in unit.params if p.kind),
        "bytes_per_rank": max(unit.param_bytes or [0]) + max(unit.quant_bytes or [0]),
        "unsharded_bytes": unit.unsharded_bytes,
    }


def _short(name: str) -> str:
    """Unit names without peft's `base_model.model.` wrapper prefix, for tables."""
    return name[len("base_model.model."):] if name.startswith("base_model.model.") else name


def to_json(result) -> dict:
    """The report as data; `findings` items are `Finding.to_json()` (ruff-compatible)."""
    plan, mem = result.plan, result.memory
    return {
        "config": result.spec.filename,
        "model": dict(result.summary, source=result.spec.model_source),
        "torch_version": result.torch_version,
        "torch_version_source": result.torch_version_source,
        "lora_coverage": [{"target": c.target, "modules": c.modules, "note": c.note} for c in result.coverage],
        "fsdp": {
            "version": plan.version,
            "world_size": plan.world_size,
            "executed": plan.executed,
            "wrap_classes": plan.wrap_classes,
            "units": [_unit_row(u, plan) for u in plan.units],
            "ignored_params": [p.fqn for p in plan.ignored],
            "unmanaged_params": [p.fqn for p in plan.unmanaged],
        },
        "memory": {
            "rank": mem.rank,
            "world_size": mem.world_size,
            "total_bytes": mem.total,
            "budget_bytes": result.spec.gpu_memory,
            "lines": [{"label": ln.label, "bytes": ln.bytes, "how": ln.how, "on_device": ln.on_device}
                      for ln in mem.lines],
            "dtensor_local_bytes_rank0": mem.dtensor_local_bytes_rank0,
            "activations": _activations_json(mem.activations),
        },
        "notes": result.notes,
        "findings": [f.to_json() for f in result.findings],
    }


def _activations_json(act):
    if act is None:
        return None
    return {"seq_len": act.seq_len, "micro_batch": act.micro_batch, "activation_checkpointing": act.checkpointing,
            "bytes": act.bytes, "layers": act.layers, "layer_class": act.layer_class,
            "kept_per_layer_bytes": act.per_layer, "kept_in_layers_bytes": act.in_layers,
            "kept_outside_layers_bytes": act.outside, "backward_extra_bytes": act.backward,
            "compute_dtype": act.compute_dtype,
            "other_checkpointing_bytes": act.other.bytes if act.other is not None else None}


def write_json(result, out: IO[str]) -> None:
    json.dump(to_json(result), out, indent=2)
    out.write("\n")


def write_text(result, out: IO[str], *, color: bool = False, max_units: int = 12) -> None:
    from rich.console import Console
    from rich.table import Table

    # The terminal's width when there is one (an 80-column terminal gets an 80-column table), else 120.
    import shutil

    width = shutil.get_terminal_size((120, 24)).columns if getattr(out, "isatty", lambda: False)() else 120
    console = Console(file=out, force_terminal=color, no_color=not color, width=max(60, min(width, 160)),
                      soft_wrap=False)
    s, plan, mem = result.summary, result.plan, result.memory
    console.print(f"[bold]{s['architecture']}[/bold] from {result.spec.model_source}: "
                  f"{s['params']:,} params, {s['trainable_params']:,} trainable "
                  f"({s['trainable_percent']:.4f}%), dtype {s['dtype']}"
                  + (f", {s['quantization']} ({s['quant_storage']} storage)" if s["quantization"] else ""))
    if result.coverage:
        t = Table(title="LoRA coverage", title_justify="left")
        t.add_column("target")
        t.add_column("modules matched", justify="right")
        t.add_column("note")
        for c in result.coverage:
            t.add_row(c.target, str(c.modules), c.note)
        console.print(t)
    mode = "executed under a fake process group" if plan.executed else "computed, not executed"
    t = Table(title=f"FSDP{plan.version} plan at world size {plan.world_size} ({mode}), {len(plan.units)} units",
              title_justify="left")
    for col, just in (("unit", "left"), ("class", "left"), ("params", "right"), ("dtypes", "left"),
                      ("requires_grad", "left"), ("4/8-bit", "right"), ("bytes/rank", "right")):
        t.add_column(col, justify=just)
    rows = [_unit_row(u, plan) for u in plan.units]
    shown = rows if len(rows) <= max_units else rows[: max_units - 2] + rows[-1:]
    for i, r in enumerate(shown):
        if len(rows) > max_units and i == max_units - 2:
            t.add_row(f"... {len(rows) - max_units + 1} more", "", "", "", "", "", "")
        t.add_row(_short(r["unit"]), r["class"], f"{r['params']:,}", ",".join(r["dtypes"]), r["requires_grad"],
                  str(r["quantized_params"]), fmt_bytes(r["bytes_per_rank"]))
    console.print(t)
    if plan.ignored or plan.unmanaged:
        console.print(f"ignored params: {len(plan.ignored)}; params outside every unit: {len(plan.unmanaged)}")
    when = "with activations" if mem.activations is not None else "before activations"
    t = Table(title=f"Memory per rank (rank {mem.rank} of {mem.world_size}, {when})", title_justify="left")
    t.add_column("what")
    t.add_column("bytes", justify="right")
    t.add_column("how computed")
    for ln in mem.lines:
        t.add_row(ln.label, fmt_bytes(ln.bytes) + ("" if ln.on_device else " (host)"), ln.how)
    budget = f" of {fmt_bytes(result.spec.gpu_memory)}" if result.spec.gpu_memory else ""
    t.add_row("[bold]total[/bold]", f"[bold]{fmt_bytes(mem.total)}[/bold]{budget}", "")
    console.print(t)
    for note in result.notes:
        console.print(f"note: {note}")
    if result.findings:
        console.print()
        for f in result.findings:
            console.print(f"{f.filename}:{f.start.row}:{f.start.column}: {f.code} [{f.severity.value}] "
                          f"{f.message}", markup=False, highlight=False)
        n = len(result.findings)
        console.print(f"Found {n} problem{'s' if n != 1 else ''}.")
    else:
        console.print("All checks passed.")
