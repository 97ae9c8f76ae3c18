"""At the stop point: the runtime guard's checks on the live model, what the first backward left
in it, and the settings the memory table of the real config is computed with.

The checks are `fsdplint.check`'s local ones (fsdplint/runtime), run on the model and optimizer the
job built; the step checks below read what only a real forward and backward leave behind (which
trainable parameters got a gradient, which the optimizer will update). The model is the shrunk twin:
its module tree, names, dtypes and trainable set are the real job's, so these findings are the job's.
"""

from __future__ import annotations

from fsdplint.runtime.codes import make_finding


def checks(model, optimizer) -> list[dict]:
    from fsdplint.runtime.local_checks import local_findings
    from fsdplint.runtime.units import scan_model

    scan = scan_model(model)
    found = local_findings(scan, optimizer) + replicated_4bit(scan)
    return [f.to_json() for f in found]


def step_checks(model, optimizer, checkpointing: dict) -> list[dict]:
    """Trainable parameters the first optimizer step will not update (FSDP504), or, under reentrant
    activation checkpointing with a frozen base, the ones no gradient reached (FSDP105)."""
    from fsdplint.runtime.units import scan_model

    if optimizer is None:
        return []
    scan = scan_model(model)
    held = {id(p) for g in optimizer.param_groups for p in g.get("params", ())}
    model_ids = {id(r.param) for r in scan.params}
    if any(i not in model_ids for i in held):
        return []  # the optimizer holds stale tensors: FSDP102 says it, with the same params
    trainable = [r for r in scan.params if r.trainable]
    missing = [r.fqn for r in trainable if id(r.param) not in held]
    # An expert that no token was routed to gets no gradient in one step on a few tokens: not a finding.
    # A parameter with no elements on this rank (FSDP1's use_orig_params views of another rank's shard)
    # holds no local gradient: the ranks that hold its elements judge it.
    judged = [r for r in trainable if id(r.param) in held and r.param.numel() > 0]
    no_grad = [r.fqn for r in judged if r.param.grad is None and "expert" not in r.fqn]
    out = []
    if missing:
        out.append(make_finding(
            "FSDP504", f"{_count(len(missing), 'trainable parameter')} ({_examples(missing)}) "
                       f"{'is' if len(missing) == 1 else 'are'} not in the optimizer: the first step leaves "
                       f"{'it' if len(missing) == 1 else 'them'} unchanged, and every later one too. Build the optimizer "
                       "from model.parameters() after get_peft_model() and the wrap."))
    if no_grad and len(no_grad) == len(judged) \
            and checkpointing.get("reentrant"):
        out.append(make_finding(
            "FSDP105", f"no gradient reached any of the {_count(len(no_grad), 'trainable parameter')} "
                       f"({_examples(no_grad)}) in the first backward: reentrant activation checkpointing over "
                       "a frozen base cuts the graph at each layer's input. Call "
                       "model.enable_input_require_grads() or use gradient_checkpointing_kwargs="
                       "{'use_reentrant': False}."))
    elif no_grad:
        out.append(make_finding(
            "FSDP504", f"{_count(len(no_grad), 'trainable parameter')} ({_examples(no_grad)}) got no gradient in "
                       "the first backward although the optimizer holds them: the step does not update them. "
                       "Check that the loss depends on them (frozen inputs, detached outputs, reentrant "
                       "checkpointing without input grads)."))
    return [f.to_json() for f in out]


def replicated_4bit(scan) -> list:
    """FSDP201 (warning): under FSDP2, bitsandbytes 4-bit weights left out of the shards (ignored_params,
    as accelerate >= 1.14 does, or outside every unit) are whole on every rank."""
    from fsdplint.runtime import units

    if not scan.has_fsdp2 or scan.has_fsdp1:
        return []
    whole = [r for r in scan.params if r.kind in (units.IGNORED, units.UNMANAGED) and not r.trainable
             and (units.is_params4bit(r.param)
                  or (units.is_4bit_module(r.owner) and r.fqn.rsplit(".", 1)[-1] == "weight"))]
    if not whole:
        return []
    return [make_finding(
        "FSDP201", f"FSDP2 did not shard the 4-bit base: {_count(len(whole), 'bitsandbytes 4-bit weight')} "
                   f"({_examples(r.fqn for r in whole)}) stay whole on every rank (ignored_params, or outside "
                   "every fully_shard unit), so each GPU holds the full quantized base (see the memory table). "
                   "That is how FSDP2 runs QLoRA safely today; to shard the base, use FSDP1 with "
                   "bnb_4bit_quant_storage equal to the model dtype.")]


def settings(model, optimizer, batch: tuple, world_size: int) -> dict:
    """The job's FSDP / LoRA / training settings as the live objects show them, in the audit's terms."""
    from fsdplint.runtime import units

    fsdp1 = units._fsdp1_type()
    state_type = units._fsdp2_state_type()
    out: dict = {"fsdp": {"world_size": world_size}, "training": {}}
    wrap, lora_units = [], False
    version = None
    for name, m in model.named_modules():
        if fsdp1 is not None and isinstance(m, fsdp1):
            version = 1
            inner = type(m._fsdp_wrapped_module).__name__
            if name and units.clean_fqn(name):
                if "lora_" in name:
                    lora_units = True
                elif inner not in wrap:
                    wrap.append(inner)
            if not name:  # the root's options
                out["fsdp"]["use_orig_params"] = bool(getattr(m, "_use_orig_params", False))
                mp = getattr(m, "mixed_precision", None)
                if mp is not None and getattr(mp, "param_dtype", None) is not None:
                    out["fsdp"]["mixed_precision"] = {"param_dtype": _dt(mp.param_dtype),
                                                      "reduce_dtype": _dt(mp.reduce_dtype)}
                off = getattr(m, "cpu_offload", None)
                out["fsdp"]["offload_params"] = bool(getattr(off, "offload_params", False))
        state = units._composable_state(m)
        if state_type is not None and isinstance(state, state_type):
            version = version or 2
            cls = _unsharded_class(m)
            if name and units.clean_fqn(name) and cls not in wrap:
                wrap.append(cls)
            for pg in getattr(state, "_fsdp_param_groups", None) or []:
                mp = getattr(pg, "mp_policy", None)
                if mp is not None and getattr(mp, "param_dtype", None) is not None:
                    out["fsdp"]["mixed_precision"] = {"param_dtype": _dt(mp.param_dtype),
                                                      "reduce_dtype": _dt(mp.reduce_dtype)}
                if type(getattr(pg, "offload_policy", None)).__name__ == "CPUOffloadPolicy":
                    out["fsdp"]["offload_params"] = True
    if version is None:
        return {}
    out["fsdp"]["version"] = version
    out["classes"] = sorted({_unsharded_class(m) for m in model.modules()})
    out["fsdp"]["wrap"] = wrap
    if version == 1 and lora_units:
        out["fsdp"]["auto_wrap_policy"] = "peft"
    scan = units.scan_model(model)
    if version == 2 and any(r.kind == units.IGNORED and (units.is_params4bit(r.param) or units.is_4bit_module(r.owner))
                            for r in scan.params):
        out["fsdp"]["ignored_params"] = "4bit"
    lora = _lora(model)
    if lora is not None:
        out["lora"] = lora
    train_dtypes = {_dt(r.param.dtype) for r in scan.params if r.trainable}
    if lora is not None and len(train_dtypes) == 1 and train_dtypes != {"float32"}:
        out["cast_after_lora"] = train_dtypes.pop()  # the job cast its adapters (e.g. model.to(bf16))
    if len(batch) == 2 and all(isinstance(n, int) and n > 0 for n in batch):
        out["training"] = {"micro_batch": batch[0], "seq_len": batch[1]}
    out["training"]["activation_checkpointing"] = bool(checkpointing(model).get("on"))
    out["training"]["adamw_fused"] = bool(optimizer is not None and optimizer.defaults.get("fused"))
    return out


def _unsharded_class(m) -> str:
    """fully_shard swaps a module's class for a generated `FSDP<Name>` subclass: the job's class name."""
    cls = type(m)
    if cls.__name__.startswith("FSDP") and len(cls.__mro__) > 2 and cls.__mro__[2].__name__ == cls.__name__[4:]:
        return cls.__name__[4:]
    if cls.__name__.startswith("FSDP") and cls.__mro__[1].__name__ == cls.__name__[4:]:
        return cls.__name__[4:]
    return cls.__name__


def checkpointing(model) -> dict:
    """Whether transformers' gradient checkpointing is on, and reentrant (its default up to v5 is
    reentrant unless gradient_checkpointing_kwargs say otherwise)."""
    on, reentrant = False, False
    for m in model.modules():
        if getattr(m, "gradient_checkpointing", False) is True:
            on = True
            fn = getattr(m, "_gradient_checkpointing_func", None)
            kw = getattr(fn, "keywords", None) or {}
            reentrant = reentrant or bool(kw.get("use_reentrant", True))
    return {"on": on, "reentrant": on and reentrant}


def _lora(model):
    for m in model.modules():
        cfgs = getattr(m, "peft_config", None)
        if isinstance(cfgs, dict) and cfgs:
            name = getattr(m, "active_adapter", None)
            name = name if isinstance(name, str) and name in cfgs else next(iter(cfgs))
            c = cfgs[name]
            if str(getattr(c, "peft_type", "")).split(".")[-1].upper() != "LORA":
                return None
            out = {}
            for k in ("r", "lora_alpha", "lora_dropout", "bias", "use_dora", "use_rslora"):
                v = getattr(c, k, None)
                if v is not None:
                    out[k] = v
            for k in ("target_modules", "modules_to_save", "exclude_modules"):
                v = getattr(c, k, None)
                if v is not None:
                    out[k] = v if isinstance(v, str) else sorted(v)
            return out
    return None


def _dt(d) -> str | None:
    return None if d is None else str(d).replace("torch.", "")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _examples(items, limit: int = 3) -> str:
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")
