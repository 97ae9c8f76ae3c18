from fsdplint import behaviour
from fsdplint.audit.examples import spec
from fsdplint.analysis import UNKNOWN
from fsdplint.facts import CITED, MEASURED, READ, Fact
from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._jobs import job_of, report_job
from fsdplint.rules._quantization import library_4bit_configs


YAML_FSDP2 = """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
"""
# trl's parser: the 4-bit switch and the dtype come from the command line.
_TRL_SCRIPT = """
from trl import ModelConfig, SFTConfig, SFTTrainer, TrlParser, get_quantization_config
parser = TrlParser((SFTConfig, ModelConfig))
training_args, model_args = parser.parse_args_and_config()
quantization_config = get_quantization_config(model_args)
training_args.model_init_kwargs = {"quantization_config": quantization_config}
SFTTrainer(model=model_args.model_name_or_path, args=training_args).train()
"""


class Fsdp2Shards4bitBase(Rule):
    code = "FSDP201"
    name = "fsdp2-shards-4bit-base"
    # A warning: the failure was not reproduced on CPU with bitsandbytes >= 0.44 (see "Why is this bad?").
    severity = Severity.WARNING
    summary = "FSDP2 shards bitsandbytes Params4bit base weights (quant_state lost; restored only by bnb >= 0.44)"
    sides = "SAR"
    versions = {"torch": ">=2.4", "bitsandbytes": "<=0.50"}
    doc = """
    ## What it does
    Finds bitsandbytes `Params4bit` weights (QLoRA base weights) inside an FSDP2 unit that are not in
    `ignored_params`. In scripts, finds a 4-bit load (`BitsAndBytesConfig(load_in_4bit=True)`) of a model
    that is then sharded with `fully_shard` without `ignored_params`, or launched with accelerate / the
    Trainer on FSDP2 where accelerate does not exclude the 4-bit weights itself. A 4-bit config built by
    trl's `get_quantization_config(model_args)` counts when the launch passes `--load_in_4bit`; its storage is
    the `ModelConfig` field that trl release reads (`torch_dtype` in 0.10-0.22, `dtype` in 0.23-0.25,
    `bnb_4bit_quant_storage` from 0.26). In axolotl and
    LLaMA-Factory configs, finds a 4-bit base under `fsdp_version: 2`, except where the tool keeps
    Params4bit itself (axolotl >= 0.12.0 with `adapter: qlora`).

    ## Why is this bad?
    bitsandbytes has no FSDP2 all-gather extension: `fully_shard` turns each `Params4bit` into a plain
    dim-0 `DTensor`, and its type and `quant_state` are lost on the parameter. What that breaks depends on
    the release and the device:
    - Measured on CPU (`python bench/facts/fsdp201_cpu_check.py`: torch 2.13.0, bitsandbytes 0.50.2,
      peft 0.21.2, transformers 5.24, 2 gloo ranks, a 4-bit Llama with LoRA, `fully_shard` on every decoder
      layer and the root, uint8 and bfloat16 storage): the weights are plain DTensors without quant_state
      after sharding, yet the logits stay within one bfloat16 rounding step (0.0039) of the unsharded
      model's, backward reaches the LoRA weights, and every weight is a sharded DTensor again after
      backward. `Linear4bit.forward` restores the quant_state from the module
      (`fix_4bit_weight_quant_state_from_module`), which exists from bitsandbytes 0.44.0 (read at 0.43.3,
      absent, and 0.44.0, present: `bench/facts/release_bisect.py bitsandbytes bitsandbytes/nn/modules.py
      --regex 'def fix_4bit_weight_quant_state_from_module'`).
    - Not measured: bitsandbytes < 0.44 (no restore; not runnable here: with 0.43.3 on the path the check
      stops at transformers 5.24's `requires bitsandbytes: pip install -U bitsandbytes>=0.46.1`, and 0.43.3
      has no CPU 4-bit kernels), CUDA kernels, float storage through NCCL (bnb#1945
      reports NaN), and accelerate's own FSDP2 preparation on GPUs, where reports describe `only Tensors of
      floating point dtype can require gradients`, loss 0.0 and "little to no memory savings". Hence a
      warning: the base weights are sharded without a 4-bit-aware all-gather, which fsdplint cannot show
      to be correct outside the measured CPU path.

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, quantization_config=BitsAndBytesConfig(load_in_4bit=True))
    model = get_peft_model(model, lora_config)
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)
    ```

    ## Use instead
    ```python
    frozen_4bit = {p for p in model.parameters() if type(p).__name__ == "Params4bit"}
    fully_shard(layer, ignored_params=frozen_4bit)  # torch >= 2.7; base weights are replicated
    ```
    or FSDP1 with `bnb_4bit_quant_storage` equal to the model dtype (see FSDP202), or torchao NF4.

    ## Fix safety
    No automatic fix.

    ## Versions
    torch >= 2.4, bitsandbytes <= 0.50; accelerate >= 1.14 ignores frozen Params4bit automatically.
    A warning on every release: the failure was measured on no release (CPU, bitsandbytes 0.50.2: no
    failure), and bitsandbytes >= 0.44 restores quant_state in the forward.

    ## References
    - accelerate#3983, accelerate#3987, bnb#1945, bnb#1719
    - axolotl#2992, trl#6343, torchtune#909
    """
    facts = (
        Fact("fully_shard turns Params4bit into plain DTensors without quant_state, yet the 4-bit LoRA model's "
             "forward and backward are right on CPU", "torch 2.13.0, bitsandbytes 0.50.2, peft 0.21.2, "
             "transformers 5.24", MEASURED,
             "2 gloo ranks, uint8 and bfloat16 storage: DTensor without quant_state after fully_shard; logits "
             "within 0.0039 (one bf16 step) of the unsharded model; LoRA grads present; DTensor after backward",
             "python bench/facts/fsdp201_cpu_check.py"),
        Fact("Linear4bit.forward restores quant_state from the module (fix_4bit_weight_quant_state_from_module)",
             "bitsandbytes >= 0.44.0", READ, "bitsandbytes/nn/modules.py",
             "python bench/facts/release_bisect.py bitsandbytes bitsandbytes/nn/modules.py --regex "
             "'def fix_4bit_weight_quant_state_from_module'", read_at=("0.43.3", "0.44.0")),
        Fact("the same check on either side of that boundary", "bitsandbytes 0.43.3 and 0.44.0 over torch 2.13.0, "
             "peft 0.21.2, transformers 5.24.0", MEASURED,
             "not measured there: transformers 5.24.0 refuses both before loading (uint8 and bfloat16, both ranks: "
             "'ImportError: Using `bitsandbytes` 4-bit quantization requires bitsandbytes: `pip install -U "
             "bitsandbytes>=0.46.1`'); the 0.43.3 side rests on the read above",
             "python bench/facts/release_run.py bitsandbytes --script bench/facts/fsdp201_cpu_check.py --at 0.43.3"),
        Fact("CUDA/NCCL failures ('only Tensors of floating point dtype can require gradients', loss 0.0, NaN)",
             "not measured", CITED, "accelerate#3983, accelerate#3987, bnb#1945"),
    )

    VALID = [
        # trl >= 0.26 takes the storage from --bnb_4bit_quant_storage (default uint8), which accelerate >= 1.14
        # excludes from sharding on torch >= 2.7; and without --load_in_4bit nothing is quantized.
        Valid(_TRL_SCRIPT, target={"trl": "0.26.0", "accelerate": "1.15.0", "torch": "2.8"},
              options={"accelerate_config": YAML_FSDP2,
                       "launch_command": "accelerate launch example.py --load_in_4bit --dtype bfloat16"}),
        Valid(_TRL_SCRIPT, target={"trl": "0.25.0", "accelerate": "1.13.0", "torch": "2.8"},
              options={"accelerate_config": YAML_FSDP2, "launch_command": "accelerate launch example.py --dtype bfloat16"}),
        # ... and FSDP1 before transformers 5.10: FSDP202's route, not this rule's.
        Valid(
            """
            import torch
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
            args = TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap")
            Trainer(model=model, args=args).train()
            """,
            target={"transformers": "4.57.1", "torch": "2.7", "accelerate": "1.15.0"},
        ),
        # Catalog correction b: the frozen 4-bit weights are excluded through ignored_params (torch >= 2.7).
        Valid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig

            bnb = BitsAndBytesConfig(load_in_4bit=True)
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb)
            frozen = {p for p in model.parameters() if type(p).__name__ == "Params4bit"}
            for layer in model.model.layers:
                fully_shard(layer, ignored_params=frozen)
            fully_shard(model, ignored_params=frozen)
            """,
            target={"torch": "2.7"},
        ),
        # FSDP1 QLoRA is the supported route (FSDP202 checks its storage dtype).
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
        model = FSDP(model)
        """,
        # FSDP2 without quantization.
        """
        import torch.distributed.fsdp as f
        from transformers import AutoModelForCausalLM as AM

        model = AM.from_pretrained("m", dtype="bfloat16")
        for block in model.model.layers:
            f.fully_shard(block)
        f.fully_shard(model)
        """,
        # The 4-bit flag is chosen at run time: the linter cannot tell.
        """
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        bnb = BitsAndBytesConfig(load_in_4bit=args.load_in_4bit)
        model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb)
        fully_shard(model)
        """,
        # ignored_params added to the kwargs only on torch >= 2.7 (version-gated, as accelerate and TRL do).
        Valid(
            """
            from torch.distributed.fsdp import fully_shard
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig

            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=BitsAndBytesConfig(load_in_4bit=True))
            kwargs = {"reshard_after_forward": True}
            if version.parse(torch.__version__) >= version.parse("2.7"):
                kwargs["ignored_params"] = {p for p in model.parameters() if not p.is_floating_point()}
            for layer in model.model.layers:
                fully_shard(layer, **kwargs)
            """,
            target={"torch": "2.7"},
        ),
    ]
    INVALID = [
        # trl 0.23-0.25 take the storage from --dtype: bfloat16 storage is sharded by accelerate.
        Invalid(_TRL_SCRIPT, line=4, target={"trl": "0.25.0", "accelerate": "1.15.0", "torch": "2.8"},
                options={"accelerate_config": YAML_FSDP2,
                         "launch_command": "accelerate launch example.py --load_in_4bit --dtype bfloat16"}),
        # Before accelerate 1.14 nothing excludes the 4-bit weights, whatever their storage.
        Invalid(_TRL_SCRIPT, line=4, target={"trl": "0.26.0", "accelerate": "1.13.0", "torch": "2.8"},
                options={"accelerate_config": YAML_FSDP2, "launch_command": "accelerate launch example.py --load_in_4bit"}),
        # TrainingArguments(fsdp=...) without a version is FSDP2 from transformers 5.10 (transformers#45640).
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
            args = TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap")
            Trainer(model=model, args=args).train()
            """,
            target={"transformers": "5.24.0", "torch": "2.7", "accelerate": "1.15.0"},
            line=4,
        ),
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig
            from peft import get_peft_model

            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
            model = get_peft_model(model, lora_config)
            for layer in model.base_model.model.model.layers:
                fully_shard(layer)
            fully_shard(model)
            """,
            line=10,
        ),
        Invalid(
            """
            import torch.distributed._composable.fsdp as fsdp2
            import transformers as tr

            def build(name):
                q = tr.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
                model = tr.AutoModelForCausalLM.from_pretrained(name, quantization_config=q)
                return model

            model = build("m")
            fsdp2.fully_shard(model)
            """,
            line=10,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import fully_shard as shard
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig as BnB

            model_kwargs = dict(quantization_config=BnB(load_in_4bit=True), dtype="bfloat16")
            model = AutoModelForCausalLM.from_pretrained("m", **model_kwargs)
            for i, block in enumerate(model.model.layers):
                shard(block, reshard_after_forward=True)
            shard(model)
            """,
            target={"torch": "2.7"},
            line=7,
        ),
    ]

    def check(self, ctx) -> None:
        job = job_of(ctx)
        if job is not None:
            self._check_job(ctx, job)
            return
        a = ctx.analysis
        configs = [c for c in a.calls("BitsAndBytesConfig") if _true(a, c, "load_in_4bit")]
        loads = [c for c in a.calls("load_model") if _true(a, c, "load_in_4bit") or _uses_config(a, c, configs)]
        lib_configs = library_4bit_configs(ctx, a)  # get_quantization_config(model_args) with --load_in_4bit
        if not configs and not loads and not lib_configs:
            return
        shards = [e for t in a.timelines for e in t.of("shard2")]
        if any(e.call is not None and a.keyword(e.call, "ignored_params") is not None for e in shards):
            return  # 4-bit weights excluded (torch >= 2.7; FSDP001 checks the version)
        where = configs[0] if configs else (loads[0] if loads else lib_configs[0])
        if shards:
            hit = _first_shard_of_4bit_model(a, shards, loads)
            if hit is None:
                return
            ctx.report(
                hit.node,
                f"fully_shard shards the bitsandbytes 4-bit base weights loaded at line {ctx.line(where.node)}: "
                "bitsandbytes has no FSDP2 support, so each Params4bit becomes a plain DTensor and its quant_state "
                "is lost. bitsandbytes >= 0.44 restores it in Linear4bit.forward (measured on CPU with bitsandbytes 0.50.2: "
                "logits within one bf16 rounding step of the unsharded model); older releases, CUDA kernels and "
                "NCCL were not measured, and reports there show 'only Tensors of floating point dtype can require "
                "gradients', loss 0.0 or NaN. "
                + _remedy(ctx.version("torch")),
            )
            return
        if getattr(a, "launch_fsdp_version", None) != 2:
            return
        torch_v, acc_v = ctx.version("torch"), ctx.version("accelerate")
        float_storage = any(_float_storage(a, c) for c in configs) or any(
            isinstance(h.storage, str) and h.storage.rsplit(".", 1)[-1] in _FLOAT_DTYPES for h in lib_configs)
        excludes = behaviour.holds("accelerate_fsdp2_ignores_params4bit", acc_v)
        if torch_v >= "2.7" and excludes and not float_storage:
            return  # accelerate excludes the uint8 Params4bit from sharding (accelerate#3987)
        # Whether accelerate excludes them depends on versions that are not known: a warning.
        severity = None if float_storage else (ctx.version_severity(acc_v) or ctx.version_severity(torch_v))
        if float_storage:
            why = ("with a floating bnb_4bit_quant_storage accelerate still shards the Params4bit (it only "
                   "excludes integer storage), so their quant_state is lost")
            if excludes is False:
                why = (f"{acc_v.describe()} shards every Params4bit (it excludes none before 1.14, and from 1.14 "
                       "only integer storage), so their quant_state is lost")
            if where in lib_configs:
                why += (f"; trl's get_quantization_config ({ctx.version('trl').describe()}) sets "
                        f"bnb_4bit_quant_storage from model_args.{where.field} ({where.storage})")
        else:
            why = (f"accelerate excludes 4-bit weights from FSDP2 only from accelerate 1.14 on torch >= 2.7, and "
                   f"the target is {acc_v.describe()}, {torch_v.describe()}")
        ctx.report(
            where.node,
            f"This 4-bit model is trained with FSDP2: {why}. Use FSDP1 with bnb_4bit_quant_storage equal to the "
            "model dtype, or keep the default uint8 storage with accelerate >= 1.14 and torch >= 2.7 (the base "
            "weights are then replicated, not sharded)."
            + (f" ({acc_v.declare_hint('1.14')}.)" if severity is not None else ""),
            severity=severity,
            rests_on=("accelerate_fsdp2_ignores_params4bit",),
        )

    def _check_job(self, ctx, job) -> None:
        """An axolotl / LLaMA-Factory job that trains a 4-bit base under FSDP2."""
        q = job.quant
        if q is None or q.bits != 4 or job.fsdp_version != 2:
            return
        gate = job.gate(self.code)
        if self.code not in job.gates:
            # No patch of the tool's own: accelerate decides (as for a script launched with FSDP2).
            torch_v, acc_v = ctx.version("torch"), ctx.version("accelerate")
            if q.storage is None and torch_v >= "2.7" and acc_v >= "1.14":
                return  # accelerate excludes the uint8 Params4bit from sharding (accelerate#3987)
        report_job(ctx, q.setting,
                   f"{job.name} trains this 4-bit model with FSDP2 ({job.fsdp_version_why}): bitsandbytes has no "
                   f"FSDP2 support, so each Params4bit becomes a plain DTensor and its quant_state is lost (bitsandbytes "
                   f">= 0.44 restores it in the forward on CPU, measured; CUDA/NCCL reports show 'only Tensors of "
                   f"floating point dtype can require gradients' or NaN)", gate,
                   job.remedy.get(self.code))

    AUDIT_VALID = [
        spec(quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"},
             fsdp={"ignored_params": "4bit"}),
        spec(quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"},
             fsdp={"version": 1, "auto_wrap_policy": "peft"}),
    ]
    AUDIT_INVALID = [
        spec(quantization={"load_in_4bit": True}),
        spec(quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"}),
    ]

    def audit(self, ctx):
        ctx.report_problems(self)
        plan = ctx.plan
        if plan.version != 2:
            return
        hits = [(u, p) for u in plan.units for p in u.params if p.kind == "4bit" and not p.ignored]
        if not hits:
            return
        units = sorted({u.label for u, _ in hits})
        fix = ("pass the frozen Params4bit as fully_shard(..., ignored_params=...) (torch >= 2.7; the base "
               "weights are then replicated, not sharded)" if ctx.torch_at_least("2.7") else
               "use FSDP1 with bnb_4bit_quant_storage equal to the model dtype (ignored_params needs "
               "torch >= 2.7)")
        ctx.report(self, f"{len(hits)} bitsandbytes Params4bit base weight(s) in {len(units)} FSDP2 unit(s) "
                         f"(e.g. {hits[0][1].fqn} in {hits[0][0].label}) are sharded as plain DTensors: "
                         f"bitsandbytes has no FSDP2 support, so quant_state is lost on the parameter "
                         f"(bitsandbytes >= 0.44 restores it in the forward, measured on CPU; CUDA/NCCL runs "
                         f"were not measured and are reported to fail). Instead, {fix}.",
                   unit=hits[0][0].name, param=hits[0][1].fqn, field="quantization")


_FLOAT_DTYPES = {"bfloat16", "float16", "float32", "half", "float", "float64"}


def _true(a, call, name) -> bool:
    expr = a.keyword(call, name)
    return expr is not None and expr is not UNKNOWN and a.value(expr, call.scope) is True


def _uses_config(a, load, configs) -> bool:
    q = a.keyword(load, "quantization_config")
    if q is None or q is UNKNOWN:
        return False
    return any(q is c.node or a.call_for(q, load.scope, "BitsAndBytesConfig") is c for c in configs)


def _float_storage(a, config) -> bool:
    expr = a.keyword(config, "bnb_4bit_quant_storage")
    if expr is None or expr is UNKNOWN:
        return False
    v = a.value(expr, config.scope)
    name = getattr(v, "name", v)
    return isinstance(name, str) and name.rsplit(".", 1)[-1] in _FLOAT_DTYPES


def _first_shard_of_4bit_model(a, shards, loads):
    """The first fully_shard on the model a 4-bit load produced; any fully_shard if the load is not traceable."""
    entities = set()
    for t in a.timelines:
        for ev in t.of("load"):
            if any(ev.call is c for c in loads):
                for tg in ev.call.targets:
                    name = getattr(tg, "value", None)
                    if isinstance(name, str):
                        entities.add((id(t), t.find(ev.step.key(name))))
    if not entities:
        return shards[0]
    for e in shards:
        if (id(e.timeline), e.entity) in entities:
            return e
    return None


def _remedy(torch_v) -> str:
    if torch_v >= "2.7":
        return ("Pass the frozen Params4bit as fully_shard(..., ignored_params=...) (the base weights are then "
                "replicated), or use FSDP1 with bnb_4bit_quant_storage (see FSDP202).")
    return (f"Use FSDP1 with bnb_4bit_quant_storage equal to the model dtype (see FSDP202); excluding them with "
            f"ignored_params needs torch >= 2.7 and the target is {torch_v.describe()}.")
