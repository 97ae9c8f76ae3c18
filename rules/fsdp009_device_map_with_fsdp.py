import re

from fsdplint.analysis import UNKNOWN
from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import Replace, remove_keyword, unsafe
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._jobs import job_of, report_job

# device_map values that spread one model over several devices (accelerate's big-model dispatch).
DISPATCHING = {"auto", "balanced", "balanced_low_0", "sequential"}
# What happens to a model that is trained under FSDP.
TRAINED = ("wrap1", "shard2", "prepare", "lora")
LOADERS = ("load_model", "PeftModel_from_pretrained")



class DeviceMapWithFsdp(Rule):
    code = "FSDP009"
    name = "device-map-with-fsdp"
    severity = Severity.ERROR
    sides = "S"
    fix = Applicability.UNSAFE
    summary = "`from_pretrained(device_map=...)` in a script that uses FSDP."
    message = (
        "`from_pretrained(device_map={value!r})` dispatches the model over several devices, but this script "
        "trains it with FSDP{via}: accelerate and the Trainer refuse it (\"You can't train a model that has been "
        "loaded with `device_map='auto'` in any distributed mode\"), and FSDP needs whole modules to shard. "
        "Drop device_map and let FSDP place the model (low_cpu_mem_usage / cpu_ram_efficient_loading keep host "
        "memory down)."
    )
    doc = """
    ## What it does
    Finds `from_pretrained(..., device_map="auto")` (or `"balanced"`, `"sequential"`, or a dict that spreads
    modules over several devices) for a model that the same script wraps with FSDP, prepares with an
    FSDP accelerate config, hands to a Trainer configured with `fsdp=`, or turns into a LoRA model there.
    A `device_map` set on one path only (`device_map = None` / `if args.load_in_4bit: device_map = "auto"`)
    is reported with that condition, unless the condition is about the launch (rank, world size,
    distributed/FSDP mode), as in `"auto" if world_size == 1 else None`. In axolotl configs, finds a
    dispatching `device_map:` with FSDP on (axolotl drops it under FSDP from v0.12.0).

    ## Why is this bad?
    `device_map="auto"` is big-model *inference* dispatch: layers are placed on different GPUs and moved
    with hooks. FSDP wants the whole module on one device (or CPU/meta) so it can shard it across ranks.
    accelerate's `prepare` raises `ValueError: You can't train a model that has been loaded with
    device_map='auto' in any distributed mode.`; raw FSDP wrapping gets mixed-device modules.

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, device_map="auto", torch_dtype=torch.bfloat16)
    model = FSDP(model, auto_wrap_policy=policy)
    ```

    ## Use instead
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
    model = FSDP(model, auto_wrap_policy=policy, device_id=torch.cuda.current_device())
    ```
    A single-device map such as `device_map={"": local_rank}` is not flagged.

    ## Fix safety
    Unsafe: the fix removes `device_map=`. The model then loads on CPU (or where FSDP's loading settings put
    it), which needs enough host memory and changes where the weights are first materialised.

    ## Versions
    All versions.

    ## References
    - transformers#31557, transformers#29587
    - accelerate `accelerator.py` (`verify_device_map`)
    """
    references = ("transformers#31557", "transformers#29587")

    VALID = [
        # Tests: the test that dispatches the model is not the one that wraps a model with FSDP.
        """
        from transformers import AutoModelForCausalLM, Trainer
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def test_offloaded_training():
            model = AutoModelForCausalLM.from_pretrained(name, device_map="auto")
            Trainer(model=model, args=args).train()

        def test_fsdp_wrap():
            FSDP(AutoModelForCausalLM.from_pretrained(name))
        """,
        """
        import torch
        from transformers import AutoModelForCausalLM
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
        model = FSDP(model, device_id=torch.cuda.current_device())
        """,
        # One device per rank is not a dispatch.
        """
        import os
        from transformers import AutoModelForCausalLM
        from torch.distributed.fsdp import fully_shard
        local_rank = int(os.environ["LOCAL_RANK"])
        model = AutoModelForCausalLM.from_pretrained(name, device_map={"": local_rank})
        fully_shard(model)
        """,
        # No FSDP: device_map="auto" for single-process inference is its purpose.
        """
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(name, device_map="auto")
        out = model.generate(**inputs)
        """,
        # One device per process under an FSDP config is not a dispatch.
        Valid(
            """
            from accelerate import Accelerator
            from transformers import AutoModelForCausalLM
            accelerator = Accelerator()
            model = AutoModelForCausalLM.from_pretrained(name, device_map={"": accelerator.process_index})
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"},
        ),
        # A separate inference model in a file that also trains with FSDP.
        """
        from transformers import AutoModelForCausalLM as AM
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        policy_model = FSDP(AM.from_pretrained(name))
        judge = AM.from_pretrained(judge_name, device_map="auto")
        """,
        # Decided at run time.
        """
        from transformers import AutoModelForCausalLM
        from torch.distributed.fsdp import fully_shard
        model = AutoModelForCausalLM.from_pretrained(name, device_map=None if distributed else "auto")
        fully_shard(model)
        """,
        # The dispatching map is chosen only for single-process runs: a launch condition, not reported.
        """
        import os
        from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
        placement = None
        if int(os.environ.get("WORLD_SIZE", 1)) == 1:
            placement = "auto"
        model = AutoModelForCausalLM.from_pretrained(name, device_map=placement)
        Trainer(model=model, args=TrainingArguments("out", fsdp="full_shard auto_wrap")).train()
        """,
    ]
    INVALID = [
        # The map is set on a quantization path of a helper: under FSDP that path fails.
        Invalid(
            """
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

            def build(opts):
                placement, quant = None, None
                if opts.low_memory:
                    quant = BitsAndBytesConfig(load_in_4bit=True)
                    placement = "auto"
                model = AutoModelForCausalLM.from_pretrained(opts.base, quantization_config=quant, device_map=placement)
                return model

            def main(opts):
                model = build(opts)
                targs = TrainingArguments("out", fsdp="full_shard auto_wrap")
                Trainer(model=model, args=targs).train()
            """,
            line=8,
            severity="warning",  # whether opts.low_memory is set is not known
        ),
        # Through a `**kwargs` dict.
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM
            from torch.distributed.fsdp import fully_shard
            load_kwargs = dict(torch_dtype=torch.bfloat16, device_map="balanced")
            model = AutoModelForCausalLM.from_pretrained(name, **load_kwargs)
            fully_shard(model)
            """,
            line=5,
        ),
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = AutoModelForCausalLM.from_pretrained(name, device_map="auto", torch_dtype=torch.bfloat16)
            model = FSDP(model)
            """,
            line=4,
            expected_fix="""
            import torch
            from transformers import AutoModelForCausalLM
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
            model = FSDP(model)
            """,
        ),
        Invalid(
            """
            import transformers as tf
            import torch.distributed.fsdp as f
            from peft import get_peft_model as add_lora

            def load(name):
                return tf.AutoModelForCausalLM.from_pretrained(name, device_map="balanced")

            model = load(name)
            model = add_lora(model, cfg)
            f.fully_shard(model)
            """,
            line=6,
        ),
        # The load is the wrap's argument, returned from a helper: the unnamed loaded model is the wrapped one.
        Invalid(
            """
            from transformers import AutoModelForCausalLM
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            def build(name):
                return FSDP(AutoModelForCausalLM.from_pretrained(name, device_map="auto"))

            model = build(name)
            """,
            line=5,
        ),
        Invalid(
            """
            from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
            model = AutoModelForCausalLM.from_pretrained(name, device_map={"model": 0, "lm_head": 1})
            args = TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap")
            trainer = Trainer(model=model, args=args)
            """,
            line=2,
        ),
        Invalid(
            """
            from peft import AutoPeftModelForCausalLM
            from torch.distributed.fsdp import fully_shard
            DEVICE_MAP = "auto"
            model = AutoPeftModelForCausalLM.from_pretrained(path, device_map=DEVICE_MAP, is_trainable=True)
            for layer in model.base_model.model.model.layers:
                fully_shard(layer)
            fully_shard(model)
            """,
            line=4,
        ),
        Invalid(
            """
            from accelerate import Accelerator
            from transformers import AutoModelForCausalLM
            accelerator = Accelerator()
            model = AutoModelForCausalLM.from_pretrained(name, device_map="auto")
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"},
            line=4,
        ),
    ]

    def check(self, ctx) -> None:
        job = job_of(ctx)
        if job is not None:
            if job.device_map is not None and job.fsdp_version is not None:
                report_job(ctx, job.device_map,
                           f"{job.name} passes device_map={job.device_map.value!r} to from_pretrained under FSDP "
                           f"({job.fsdp_version_why}): accelerate dispatches the layers over the GPUs of one rank "
                           f"before FSDP shards them", job.gate(self.code), job.remedy.get(self.code))
            return
        a = ctx.analysis
        if a.launch_fsdp_version is None and not a.calls("FSDP1", "fully_shard"):
            return
        for t in a.timelines:
            for ev in t.events:
                call = ev.call
                if call is None or call.api not in LOADERS:
                    continue
                arg = call.kwarg("device_map")
                expr = arg.value if arg is not None else a.keyword(call, "device_map")  # also `**model_kwargs`
                if expr is UNKNOWN:
                    # `kw["device_map"] = "auto"` under an `if` the known values do not decide: that path.
                    when, value = _dispatching_dict_path(a, call)
                    if when is None:
                        continue
                elif expr is None:
                    continue
                else:
                    value = a.value(expr, call.scope)
                    when = ""
                if not when and not _dispatches(value):
                    # `device_map = None` / `if args.load_in_4bit: device_map = "auto"`: on that path.
                    when, value = _dispatching_path(a, expr, call.scope)
                    if when is None:
                        continue
                via = _fsdp_source(a, call)
                if via is None or not _is_trained(a, t, ev):
                    continue
                text = remove_keyword(call.node, "device_map") if arg is not None else None
                fix = unsafe("Remove device_map", Replace(call.node, text)) if text else None
                message = self.message.format(value=value, via=via)
                if when:
                    # The known values do not decide the condition (a flag the launch may or may not pass): a warning.
                    message = message.replace(" dispatches the model", f" ({when}) dispatches the model", 1)
                ctx.report(call.node, message, fix=fix if not when else None,
                           severity=Severity.WARNING if when else None)


# A condition on these is how scripts pick a device map per launch mode (`"auto" if world_size == 1 else
# None`): correlated with FSDP being off, so a dispatch on that path is not reported.
_LAUNCH_WORDS = re.compile(r"(?i)rank|world|distributed|ddp|fsdp|deepspeed|zero|process|parallel|accelerat|"
                           r"device|cuda|gpu|nproc|single|multi|is_main|local|launch|shard|torchrun|slurm|env")


def _dispatching_path(a, expr, scope):
    """(the condition text, the dispatching value) when `expr` holds a dispatching device_map only on
    some paths whose tests do not concern the launch (a quantization flag, a model-size switch); else
    (None, None)."""
    conds = a.value_conditions(expr, scope, _dispatches)
    if not conds:
        return None, None
    parts = []
    for test, holds in conds:
        text = " ".join(a.code(test).split())
        if _LAUNCH_WORDS.search(text):
            return None, None
        if a.env is not None and a._mentions_env(test) and not a.opened_by_switch(test, scope, holds):
            return None, None  # a parsed argument the launch leaves unknown does not make the path reachable
        parts.append(text if holds else f"not ({text})")
    values = [v for v in a.values(expr, scope) if _dispatches(v)]
    if not values:
        return None, None
    return "when " + " and ".join(parts), values[0]


def _dispatching_dict_path(a, call):
    """(the condition text, the dispatching value) when the call's `**kwargs` dict holds a dispatching
    device_map on one path only (a write or branch the known values do not decide); else (None, None)."""
    for entries, conds in a.keyword_paths(call) or ():
        expr = entries.get("device_map")
        value = a.value(expr, call.scope) if expr is not None else None
        if not _dispatches(value):
            continue
        parts = []
        for test, holds in conds:
            text = " ".join(a.code(test).split())
            if _LAUNCH_WORDS.search(text) or (a.env is not None and a._mentions_env(test)
                                              and not a.opened_by_switch(test, call.scope, holds)):
                return None, None
            parts.append(text if holds else f"not ({text})")
        return "when " + " and ".join(parts), value
    return None, None


def _dispatches(value) -> bool:
    if isinstance(value, str):
        return value in DISPATCHING
    if isinstance(value, dict):
        return len(value) > 1 or any(k != "" for k in value)
    return False


def _fsdp_source(a, call):
    """How the code at `call` comes to run under FSDP (for the message), or None."""
    if a.fsdp_at(call, launch=False):
        return ""
    launch = getattr(a, "launch", None)
    if a.launch_fsdp_version is not None:
        src = getattr(launch, "source", None)
        return f" (launch config {src})" if src else " (TrainingArguments/FullyShardedDataParallelPlugin fsdp settings)"
    return None


def _is_trained(a, t, load) -> bool:
    """The loaded model is wrapped, prepared, given LoRA, or handed to a Trainer in this script."""
    keys = _load_keys(t, load)
    if not keys:
        # `return from_pretrained(...)` in a helper: the caller's target holds the model.
        call = load.call
        if call is not None and call.stmt is not None and _is_return_of(call):
            return any(e.kind in TRAINED and e.entity is not None for e in t.events if e.seq > load.seq)
        return False
    entities = {t.find(k) for k in keys}
    if any(e.kind in TRAINED and e.entity in entities for e in t.events):
        return True
    for step in t.steps:  # `Trainer(model=m)` with any name for the model (`net = model`)
        trainer = step.call
        m = trainer.arg(0, "model") if trainer is not None and trainer.api == "Trainer" else None
        r = a.ref(m, step) if m is not None else None
        if r is not None and t.find(r.key) in entities:
            return True
    names = {k.rsplit(":", 1)[-1] for k in keys}
    for trainer in a.calls("Trainer"):
        m = trainer.arg(0, "model")
        if m is not None and dotted(m) in names:
            return True
    return False


def _load_keys(t, load) -> list[str]:
    call = load.call
    out = []
    for tg in t.analysis.result_targets(call) if call else []:
        d = dotted(tg)
        if d:
            out.append(t.analysis._target_key(load.step, d))
    if not out and call is not None:
        # `FSDP(AutoModel.from_pretrained(...))`: the load's unnamed result, as the analysis names it.
        r = t.analysis.ref(call.node, load.step)
        if r is not None and not r.child:
            out.append(r.key)
    return out


def _is_return_of(call) -> bool:
    import libcst as cst

    node = call.stmt.node
    return isinstance(node, cst.SimpleStatementLine) and any(
        isinstance(s, cst.Return) and s.value is call.node for s in node.body
    )
