from fsdplint import behaviour
from fsdplint.audit.examples import spec
from fsdplint.analysis import QName
from fsdplint.analysis.framework import FRAMEWORK_WRAP_KINDS, declare_hint, framework_wraps
from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import InsertLinesAfter, unsafe
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid

# pytorch#154103 ("[FSDP2] allow different dtypes for no grad model params", merged 2025-05):
# before it, every parameter of an FSDP2 group needed one dtype, frozen ones included.
FROZEN_DTYPES_RELAXED_IN = "2.8"


class MixedDtypeUnit(Rule):
    code = "FSDP005"
    name = "mixed-dtype-unit"
    severity = Severity.ERROR
    summary = (
        "FSDP1: one flat parameter mixes dtypes; FSDP2: the trainable params of one unit differ in dtype "
        "(frozen params may differ on torch releases with pytorch#154103; all params had to match before)"
    )
    sides = "SAR"
    fix = Applicability.UNSAFE
    versions = {"torch": ">=2.4"}
    doc = """
    ## What it does
    Checks the dtypes inside each planned FSDP unit: FSDP1 flattens a unit into one `FlatParameter`, which
    needs one floating dtype; FSDP2 needs one original dtype among the trainable parameters of a group
    (all parameters on torch releases before pytorch#154103).
    In scripts, it flags `get_peft_model` on a model loaded in bf16/fp16 (peft keeps the adapters in float32)
    that is then wrapped without a cast: with FSDP1 under a class/size-based policy, and with FSDP2 on torch
    releases before pytorch#154103. A framework's FSDP1 wrap counts with the job's plan
    (`fsdplint/analysis/framework.py`): `accelerator.prepare` under a named accelerate policy, the Trainer's
    `train()` before transformers 4.39 (from 4.39 it gives a PEFT model peft's policy, whose LoRA units are
    separate). With no transformers release declared, pinned or installed the job may run either side of
    4.39: a warning that says to declare it.

    ## Why is this bad?
    peft's `get_peft_model(autocast_adapter_dtype=True)` keeps LoRA weights in float32 next to a bfloat16
    base, `modules_to_save` copies stay in the base dtype, and `prepare_model_for_kbit_training` upcasts
    norms. FSDP1 raises `ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and
    torch.float32`; FSDP2 raises `AssertionError: FSDP expects uniform original parameter dtype but got
    {torch.bfloat16, torch.float32}` at the first forward.

    The audit names the cause of each float32 tensor: peft's fp32 upcast of bf16/fp16 adapters
    (`cast_adapter_dtype`, peft 0.21.2 tuners/tuners_utils.py; off with `get_peft_model(...,
    autocast_adapter_dtype=False)`, or `--no-autocast-adapter-dtype`), a 4-bit layer's float32
    `bnb_4bit_compute_dtype` (peft creates a layer's adapters in its base layer's dtype, a bnb 4-bit
    layer's compute dtype: `_move_adapter_to_device_of_base_layer`), or weights transformers keeps in
    float32 (`_keep_in_fp32_modules`, e.g. DeepSeek-V3's router `mlp.gate.weight`). An FSDP1 plan that
    fails for several reasons gets one finding per reason, in the order torch raises them
    (`_validate_frozen_params` first, then each unit's `_validate_tensors_to_flatten`; torch 2.13
    distributed/fsdp/_wrap_utils.py and _flat_param.py), each found assuming the earlier ones fixed.

    ## Example
    ```python
    model = get_peft_model(model, LoraConfig(target_modules=["q_proj"], modules_to_save=["input_layernorm"]))
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)
    ```

    ## Use instead
    ```python
    model.to(torch.bfloat16)  # one dtype before sharding, or wrap LoRA/trainable modules separately
    ```

    ## Fix safety
    Unsafe: casting adapters changes numerics.

    ## Versions
    FSDP2: frozen parameters may have another dtype since pytorch#154103 (first release assumed 2.8);
    a later change on PyTorch main splits groups by dtype (not in 2.13).

    ## References
    - accelerate#3985, verl#4275, pytorch#154103
    - peft `mapping_func.py` (autocast_adapter_dtype)
    """
    AUDIT_VALID = [spec(), spec(fsdp={"version": 1, "auto_wrap_policy": "peft"})]
    AUDIT_INVALID = [
        spec(lora={"r": 8, "target_modules": ["q_proj"], "modules_to_save": ["input_layernorm"]}),
        spec(fsdp={"torch": "2.7"}),
        spec(fsdp={"version": 1, "use_orig_params": True}),
    ]

    # -- static side: peft's fp32 adapters next to a bf16/fp16 base, wrapped without a cast -----------
    message_static = (
        "get_peft_model keeps the LoRA weights in float32 (autocast_adapter_dtype=True) while the base model is "
        "loaded in {dtype} (line {load_line}); {wrap} (line {wrap_line}) then puts both dtypes in one unit: "
        "{consequence} Cast the PEFT model to one dtype before wrapping (model.to({dtype_src})), or pass "
        "autocast_adapter_dtype=False."
    )
    VALID = [
        # accelerate FSDP1 with peft's policy set on the plugin: each LoRA layer is a unit of its own.
        Valid(
            """
            import torch
            from accelerate import Accelerator
            from transformers import AutoModelForCausalLM
            from peft import get_peft_model
            from peft.utils.other import fsdp_auto_wrap_policy
            accelerator = Accelerator()
            model = get_peft_model(AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16), cfg)
            accelerator.state.fsdp_plugin.auto_wrap_policy = fsdp_auto_wrap_policy(model)
            model = accelerator.prepare(model)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"},
        ),
        # The adapters stay in the base dtype.
        Valid(
            """
            import torch
            from accelerate import Accelerator
            from transformers import AutoModelForCausalLM
            from peft import get_peft_model
            accelerator = Accelerator()
            model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
            model = get_peft_model(model, cfg, autocast_adapter_dtype=False)
            model = accelerator.prepare(model)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"},
        ),
        """
        import torch
        from transformers import AutoModelForCausalLM
        from peft import get_peft_model
        from torch.distributed.fsdp import fully_shard
        model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
        model = get_peft_model(model, cfg)
        model.to(torch.bfloat16)
        for layer in model.base_model.model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        """,
        """
        import torch
        from transformers import AutoModelForCausalLM
        from peft import get_peft_model
        from torch.distributed.fsdp import fully_shard
        model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
        model = get_peft_model(model, cfg, autocast_adapter_dtype=False)
        fully_shard(model)
        """,
        # peft's policy puts the fp32 LoRA leaves in their own FSDP1 units.
        """
        import torch
        from transformers import AutoModelForCausalLM
        from peft import get_peft_model
        from peft.utils.other import fsdp_auto_wrap_policy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
        model = get_peft_model(model, cfg)
        model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=False)
        """,
        # torch >= 2.8 (pytorch#154103): frozen bf16 base next to trainable fp32 LoRA is allowed in FSDP2.
        Valid(
            """
            import torch
            from transformers import AutoModelForCausalLM
            from peft import get_peft_model
            from torch.distributed.fsdp import fully_shard
            model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16)
            model = get_peft_model(model, cfg)
            fully_shard(model)
            """,
            target={"torch": "2.8"},
        ),
        # float32 base: nothing to mix.
        """
        import torch
        from transformers import AutoModelForCausalLM
        from peft import get_peft_model
        from torch.distributed.fsdp import fully_shard
        model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float32)
        model = get_peft_model(model, cfg)
        fully_shard(model)
        """,
    ]
    INVALID = [
        # accelerate wraps with FSDP1 and its default (transformer-block) policy: a block's bf16 base weights
        # and its fp32 LoRA weights form one FlatParameter.
        Invalid(
            """
            import torch
            from accelerate import Accelerator
            from transformers import AutoModelForCausalLM
            from peft import LoraConfig, get_peft_model
            accelerator = Accelerator()
            model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
            model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"
                                          "  fsdp_use_orig_params: true\n"},
            line=7,
        ),
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM
            from peft import get_peft_model
            from torch.distributed.fsdp import fully_shard
            model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
            model = get_peft_model(model, cfg)
            for layer in model.base_model.model.model.layers:
                fully_shard(layer)
            fully_shard(model)
            """,
            line=6,
            expected_fix="""
            import torch
            from transformers import AutoModelForCausalLM
            from peft import get_peft_model
            from torch.distributed.fsdp import fully_shard
            model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
            model = get_peft_model(model, cfg)
            model.to(torch.bfloat16)
            for layer in model.base_model.model.model.layers:
                fully_shard(layer)
            fully_shard(model)
            """,
        ),
        # FSDP1 flattens each unit into one FlatParameter: every torch version.
        Invalid(
            """
            import functools
            import transformers as tf
            from peft import get_peft_model as add_lora
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

            def main():
                base = tf.AutoModelForCausalLM.from_pretrained(name, torch_dtype="bfloat16")
                model = add_lora(base, cfg)
                policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
                model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
            """,
            target={"torch": "2.9"},
            line=9,
        ),
        Invalid(
            """
            import torch
            import torch.distributed.fsdp as f
            from transformers import AutoModelForCausalLM
            from peft import PeftModel
            DTYPE = torch.float16
            base = AutoModelForCausalLM.from_pretrained(name, torch_dtype=DTYPE)
            model = PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)
            f.fully_shard(model)
            """,
            target={"torch": "2.6"},
            line=7,
        ),
    ]

    # The Trainer's wrap (analysis/framework.py): before transformers 4.39 it kept the launch's policy for a PEFT
    # model, so a decoder layer's bf16 base and fp32 LoRA weights were one FlatParameter; from 4.39 peft's policy
    # gives the LoRA leaves units of their own.
    INVALID += [
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
            from peft import LoraConfig, get_peft_model

            def build(name):
                base = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
                return get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj"]))

            model = build(args.model)
            trainer = Trainer(model=model, args=TrainingArguments(output_dir="o", fsdp="full_shard auto_wrap"))
            trainer.train()
            """,
            target={"transformers": "4.38.2", "torch": "2.4", "peft": "0.13.0"},
            line=7,
        ),
        # The same with no transformers declared: a warning (the swap to peft's policy needs 4.39).
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM, Trainer
            from peft import LoraConfig, get_peft_model
            model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16)
            model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
            Trainer(model=model, args=training_args).train()
            """,
            target={"torch": "2.4", "peft": "0.13.0"},
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                                          "  fsdp_version: 1\n"},
            line=5,
            severity="warning",
        ),
    ]
    VALID += [
        Valid(
            """
            import torch
            from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
            from peft import LoraConfig, get_peft_model
            base = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
            model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj"]))
            Trainer(model=model, args=TrainingArguments(output_dir="o", fsdp="full_shard auto_wrap")).train()
            """,
            target={"transformers": "4.39.0", "torch": "2.4", "peft": "0.13.0"},
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        tv = ctx.version("torch")
        plans = {id(fw.event): fw for fw in framework_wraps(a, ctx)}
        for t in a.timelines:
            for lora in t.of("lora"):
                call = lora.call
                if call is None or call.api not in ("get_peft_model", "PeftModel_from_pretrained") or lora.entity is None:
                    continue
                if call.kw("autocast_adapter_dtype") is not None or call.star_kwargs():
                    continue  # set explicitly (or maybe): the user decided
                if behaviour.holds("peft_autocast_adapter_dtype", ctx.version("peft")) is False:
                    continue  # peft < 0.12 keeps the adapters in the base model's dtype
                load, dtype = _half_load(a, t, lora)
                if load is None:
                    continue
                wraps = t.after(lora, ("wrap1", "shard2") + FRAMEWORK_WRAP_KINDS)
                wraps = [w for w in wraps if w.kind in ("wrap1", "shard2") or (
                    id(w) in plans and plans[id(w)].version == 1 and plans[id(w)].policy == "mixing"
                    and plans[id(w)].by != "composer")]  # (Composer's mixed precision was not read)
                if not wraps or _cast_between(a, t, lora, wraps[0]):
                    continue
                w = wraps[0]
                escapes = getattr(t, "escapes", None)
                if escapes is not None and escapes(lora.entity, w):
                    continue
                severity, hint, rests = None, "", ("peft_autocast_adapter_dtype",)
                if w.kind in FRAMEWORK_WRAP_KINDS:
                    fw = plans[id(w)]
                    wrap = f"{fw.wrapper} under FSDP1 ({fw.policy_text})"
                    consequence = ("FSDP1 flattens each unit into one FlatParameter and raises \"Must flatten tensors "
                                   "with uniform dtype but got torch.bfloat16 and torch.float32\".")
                    hint = declare_hint(fw)
                    severity = Severity.WARNING if fw.undecided else None
                    rests += fw.rests_on
                elif w.kind == "shard2":
                    if not tv < FROZEN_DTYPES_RELAXED_IN:
                        continue
                    wrap = "fully_shard"
                    consequence = (f"on {tv.describe()} all parameters of an FSDP2 unit need one dtype (frozen ones "
                                   f"may differ only since pytorch#154103), so the first forward raises "
                                   f"\"FSDP expects uniform original parameter dtype\".")
                else:
                    if not _flat_policy(a, w.call):
                        continue
                    wrap = "FullyShardedDataParallel"
                    consequence = ("FSDP1 flattens each unit into one FlatParameter and raises \"Must flatten tensors "
                                   "with uniform dtype but got torch.bfloat16 and torch.float32\".")
                src = _dtype_src(a, load, dtype)
                msg = self.message_static.format(
                    dtype=dtype, load_line=ctx.line(load.node), wrap=wrap, wrap_line=ctx.line(w.node),
                    consequence=consequence, dtype_src=src or f"torch.{dtype}",
                )
                ctx.report(call.node, msg + hint, fix=_cast_fix(call, src), severity=severity, rests_on=rests)

    def audit(self, ctx):
        plan = ctx.plan
        for problem, units in ctx.grouped_plan_problems(self.code):
            if plan.version == 1:
                message = f"{ctx.raised(problem)} ValueError: {problem.message}."
            else:
                message = f"FSDP2 raises at the first forward of unit {units[0] or '(root)'}: {problem.message}."
            advice = problem.cause or ("Cast the model to one dtype before wrapping, or put parameters of another "
                                       "dtype in their own unit.")
            ctx.report(self, f"{message}{ctx.more_units(units)} {advice}", unit=units[0],
                       field="lora" if "autocast_adapter_dtype" in advice else "fsdp")
        if plan.version == 2 and not ctx.torch_at_least(FROZEN_DTYPES_RELAXED_IN):
            mixed = [u for u in plan.units
                     if len({p.dtype for p in u.params if p.kind != "4bit"}) > 1
                     and len({p.dtype for p in u.params if p.requires_grad}) <= 1]
            if mixed:
                from fsdplint.audit.params import dtype_name

                names = sorted({dtype_name(p.dtype) for p in mixed[0].params if p.kind != "4bit"})
                ctx.report(self, f"FSDP2 unit {mixed[0].label} mixes dtypes {names}: torch "
                                 f"{ctx.torch_version} ({ctx.torch_version_source}) requires one dtype for "
                                 f"all parameters of a unit, frozen ones included (relaxed by "
                                 f"pytorch#154103), and raises \"FSDP expects uniform original parameter "
                                 f"dtype\".{ctx.more_units([u.name for u in mixed])} Cast the model to one "
                                 f"dtype before fully_shard.", unit=mixed[0].name, field="fsdp")


HALF = {"bfloat16": "bfloat16", "float16": "float16", "half": "float16", "bf16": "bfloat16", "fp16": "float16"}
CASTS = {"to", "bfloat16", "half", "float", "type"}


def _half_load(a, t, lora):
    """The from_pretrained call that built the base model in bf16/fp16, and that dtype's name."""
    base = lora.call.arg(0, "model")
    base_entity = t.find(t.analysis.ref(base, lora.step).key) if base is not None and t.analysis.ref(base, lora.step) else None
    for ev in t.events:
        call = ev.call
        if ev.seq >= lora.seq or call is None or call.api != "load_model":
            continue
        keys = [a._target_key(ev.step, dotted(tg)) for tg in call.targets if dotted(tg)]
        if not keys:
            # `get_peft_model(AutoModel.from_pretrained(...), cfg)`: the load's unnamed result.
            r = a.ref(call.node, ev.step)
            keys = [r.key] if r is not None and not r.child else []
        if not any(t.find(k) in (lora.entity, base_entity) for k in keys):
            continue
        if call.kw("quantization_config") is not None or call.kw("load_in_4bit") or call.kw("load_in_8bit"):
            return None, None  # quantized bases are FSDP201/FSDP202's business
        expr = call.kw("torch_dtype") or call.kw("dtype")
        v = a.value(expr, call.scope) if expr is not None else None
        name = v.name.rsplit(".", 1)[-1] if isinstance(v, QName) and v.name.startswith("torch.") else v
        if isinstance(name, str) and name in HALF:
            return call, HALF[name]
        return None, None
    return None, None


def _cast_between(a, t, lora, wrap) -> bool:
    """Any dtype cast of the model (or of its parameters in a loop) between injection and wrapping."""
    for step in t.steps:
        call = step.call
        order = step.order if step.order >= 0 else step.seq
        if call is None or not lora.seq < order < wrap.seq or call.method not in CASTS:
            continue
        if call.loops:
            return True  # `for p in model.parameters(): p.data = p.data.to(...)`
        r = a.ref(call.receiver, step) if call.receiver is not None else None
        if r is not None and t.find(r.key) == lora.entity:
            return True
    return False


def _flat_policy(a, call) -> bool:
    """The FSDP1 policy is known to put LoRA and base weights together: none, or a class/size-based one."""
    if call is None or call.star_kwargs():
        return False
    pol = call.kw("auto_wrap_policy")
    if pol is None:
        return True
    for api in ("ModuleWrapPolicy",):
        if a.call_for(pol, call.scope, api) is not None:
            return True
    expr = pol
    for _ in range(3):
        d = dotted(expr) if expr is not None else None
        if d is None:
            break
        nxt = a.binding(d, call.scope)
        if nxt is None:
            break
        expr = nxt
    import libcst as cst

    if isinstance(expr, cst.Call) and dotted(expr.func) in ("functools.partial", "partial") and expr.args:
        q = a.resolver.qualify(expr.args[0].value)
        return bool(q) and q.endswith((".transformer_auto_wrap_policy", ".size_based_auto_wrap_policy"))
    return False


def _dtype_src(a, load, dtype):
    """Source text for the load dtype that is valid anywhere in the file, or None."""
    expr = load.kw("torch_dtype") or load.kw("dtype")
    q = a.resolver.qualify(expr) if expr is not None else None
    if q and q.startswith("torch."):
        return a.code(expr)
    torch_name = next((local for local, qn in a.resolver.names.items() if qn == "torch"), None)
    return f"{torch_name}.{dtype}" if torch_name else None


def _cast_fix(call, src):
    import libcst as cst

    stmt = call.stmt
    if src is None or stmt is None or not isinstance(stmt.node, cst.SimpleStatementLine) or len(stmt.node.body) != 1:
        return None
    assign = stmt.node.body[0]
    if not isinstance(assign, cst.Assign) or assign.value is not call.node or len(assign.targets) != 1:
        return None
    target = dotted(assign.targets[0].target)
    if target is None:
        return None
    return unsafe("Cast the PEFT model to the base dtype before wrapping",
                  InsertLinesAfter(stmt.node, f"{target}.to({src})"))
