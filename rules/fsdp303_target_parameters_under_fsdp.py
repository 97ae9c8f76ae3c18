from fsdplint.audit.examples import spec
from fsdplint.facts import MEASURED, Fact
from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid

from fsdplint.rules._lora_config import target_parameters

YAML_FSDP2 = """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
num_processes: 8
"""


YAML_FSDP1 = """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 1
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_use_orig_params: true
num_processes: 8
"""


class TargetParametersUnderFsdp(Rule):
    code = "FSDP303"
    name = "target-parameters-under-fsdp"
    severity = Severity.ERROR
    summary = ("peft `target_parameters` (ParamWrapper) under FSDP1, or in an FSDP2 unit not gathered when "
               "ParamWrapper reads it (peft#3080)")
    sides = "SA"
    versions = {"peft": ">=0.17.0"}
    facts = (
        Fact("peft target_parameters LoRA fails under FSDP1 and under FSDP2 units rooted below the ParamWrapper; "
             "fully_shard per decoder layer or at the root is exact", "torch 2.13.0, peft 0.21.2, transformers 5.24.0",
             MEASURED,
             "a small Mixtral, LoRA on w1/w2/w3, world size 1: fsdp2-layer, fsdp2-layer-checkpointed, fsdp2-root: loss "
             "and 8 LoRA gradients equal no-FSDP; fsdp2-experts and fsdp2-lora-leaves: 'RuntimeError: "
             "aten.baddbmm.default got mixed torch.Tensor and DTensor'; fsdp1-layer and fsdp1-root: 'RuntimeError: "
             "Output 0 of View is a view and its base or another view of its base has been modified inplace'; "
             "fsdp1-peft-policy: 'AssertionError: Module already has an attribute named 'down_proj''",
             "python bench/facts/fsdp303_cpu_check.py"),
        Fact("the same check at the oldest release the rule claims", "peft 0.17.0 over torch 2.13.0, "
             "transformers 5.24.0", MEASURED,
             "not measured there: peft 0.17.0 does not import with transformers 5.24.0 (ImportError: cannot import "
             "name 'HybridCache' from 'transformers'), so every plan stops before FSDP",
             "python bench/facts/release_run.py peft --script bench/facts/fsdp303_cpu_check.py --at 0.17.0"),
        Fact("peft 0.17.0 with transformers 4.57.6 (over torch 2.13.0)", "peft 0.17.0, transformers 4.57.6",
             MEASURED,
             "the ParamWrapper path is not reached: transformers 4.57.6's Mixtral keeps one nn.Linear per expert, so "
             "LoRA on w1/w2/w3 is ordinary LoRA (48 adapted modules); every plan gives the no-FSDP loss and gradients "
             "except fsdp2-layer-checkpointed ('CheckpointError: torch.utils.checkpoint: Recomputed values for the "
             "following tensors have different metadata', the KV cache under recomputation, FSDP107's failure)",
             "python bench/facts/release_run.py peft --script bench/facts/fsdp303_cpu_check.py --at 0.17.0 --with "
             "transformers==4.57.6 --with huggingface_hub==0.36.0 --with tokenizers==0.22.1 --with requests --with "
             "urllib3 --with charset_normalizer --with certifi"),
    )
    doc = """
    ## What it does
    Finds peft `target_parameters` LoRA (`lora.ParamWrapper`, what peft makes of fused MoE experts) in an
    FSDP plan that breaks it: any FSDP1 plan that flattens the adapted parameter, and FSDP2 plans where
    the adapter weights or the adapted parameter sit in a unit rooted *below* the ParamWrapper (a unit
    whose forward never runs around the adapter computation). The audit checks every ParamWrapper of the
    real model against the real plan; in scripts the rule reports `target_parameters` under FSDP1
    (`FullyShardedDataParallel`, an accelerate FSDP1 config, or `fsdp_config={"version": 1}`).

    ## Why is this bad?
    `ParamWrapper.forward` does not call its `lora_A`/`lora_B` modules: `_activate_lora` reads
    `lora_A[adapter].weight` and `lora_B[adapter].weight` directly (`get_delta_factors` /
    `get_delta_weight`), registers a `torch.nn.utils.parametrize` parametrization on the base layer's
    parameter, calls the base layer, and removes the parametrization (peft 0.21.2, tuners/lora/layer.py).

    - FSDP2 gathers a unit's parameters in the pre-forward hook of the unit's root module. A unit rooted
      at a `lora_A`/`lora_B` Linear or at the experts module itself is not gathered when ParamWrapper
      reads it: `RuntimeError: aten.baddbmm.default got mixed torch.Tensor and DTensor`.
    - FSDP1 replaces each original parameter with a view into its `FlatParameter`; the parametrization
      moves and restores that view and the step fails — with `use_orig_params=True` and decoder-layer
      or root units, `RuntimeError: Output 0 of View is a view and its base ... has been modified
      inplace`; with peft's `fsdp_auto_wrap_policy`, which also wraps every LoRA leaf in a unit of its
      own, `AssertionError: Module already has an attribute named 'down_proj'`.

    Measured on CPU (gloo; torch 2.13.0, peft 0.21.2, transformers 5.24.0, a small Mixtral with LoRA on
    w1/w2/w3, which peft converts to `target_parameters`; `bench/facts/fsdp303_cpu_check.py`): FSDP2
    `fully_shard` per decoder layer (also with activation checkpointing, as accelerate applies it) and
    root only give the same loss and gradients as no FSDP, to the bit, at world sizes 1 and 2; the
    failing plans above raise the errors quoted.

    ## Example
    ```python
    cfg = LoraConfig(target_modules=["q_proj", "v_proj"], target_parameters=["mlp.experts.gate_up_proj"])
    model = get_peft_model(model, cfg)
    model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=True)
    ```

    ## Use instead
    ```python
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)          # one unit holds the experts and their adapters
    fully_shard(model)
    ```

    ## Fix safety
    No automatic fix.

    ## Versions
    peft >= 0.17.0 (where `target_parameters` exists); read and measured with peft 0.21.2, torch 2.13.

    ## References
    - peft#3080, #2638, #3009, #3711; axolotl#2992
    - peft 0.21.2 tuners/lora/layer.py (`ParamWrapper._activate_lora`), peft/utils/other.py
      (`fsdp_auto_wrap_policy`); torch 2.13 distributed/fsdp/_flat_param.py, nn/utils/parametrize.py
    """
    references = ("peft#3080",)

    VALID = [
        # Expert LoRA without FSDP.
        """
        from peft import LoraConfig, get_peft_model
        cfg = LoraConfig(r=16, target_parameters=["mlp.experts.gate_up_proj"], lora_dropout=0.0)
        model = get_peft_model(model, cfg)
        """,
        # Module targets under FSDP.
        """
        from peft import LoraConfig
        from torch.distributed.fsdp import fully_shard
        cfg = LoraConfig(r=16, target_modules=["q_proj", "v_proj"])
        fully_shard(model)
        """,
        Valid(
            """
            from peft import LoraConfig
            cfg = LoraConfig(r=16, target_modules="all-linear", target_parameters=[])
            """,
            options={"accelerate_config": YAML_FSDP2},
        ),
        # FSDP2 per decoder layer: the unit holds the experts and their adapters (exact gradients).
        """
        from peft import LoraConfig, get_peft_model
        from torch.distributed.fsdp import fully_shard
        cfg = LoraConfig(r=16, target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
        model = get_peft_model(model, cfg)
        for layer in model.base_model.model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        """,
        # accelerate FSDP2 wraps decoder layers (and ignores peft's policy if the Trainer swaps it in).
        Valid(
            """
            import peft
            cfg = peft.LoraConfig(r=16, target_parameters=["experts.gate_up_proj"])
            """,
            options={"accelerate_config": YAML_FSDP2},
        ),
        # The FSDP version of TrainingArguments(fsdp=...) depends on the transformers version (2 in 5.x).
        """
        from peft import LoraConfig as LC
        from trl import SFTConfig
        expert_params = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
        peft_config = LC(r=32, target_parameters=expert_params)
        args = SFTConfig(output_dir="out", fsdp="full_shard auto_wrap")
        """,
    ]
    INVALID = [
        Invalid(
            """
            from peft import LoraConfig, get_peft_model
            from peft.utils.other import fsdp_auto_wrap_policy
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            cfg = LoraConfig(r=16, target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
            model = get_peft_model(model, cfg)
            model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=True)
            """,
            line=4,
        ),
        # FSDP1 over decoder layers: the parametrization breaks FSDP1's flat-parameter views.
        Invalid(
            """
            from peft import LoraConfig, get_peft_model
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            cfg = LoraConfig(r=16, target_parameters=["mlp.experts.gate_up_proj"])
            model = get_peft_model(model, cfg)
            model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({MixtralDecoderLayer}), use_orig_params=True)
            """,
            line=4,
        ),
        # Under an FSDP1 launch (the Trainer even swaps in peft's fsdp_auto_wrap_policy).
        Invalid(
            """
            from peft import LoraConfig
            from transformers import Trainer
            cfg = LoraConfig(r=16, target_parameters=["experts.gate_up_proj"])
            Trainer(model=model, args=args, peft_config=cfg).train()
            """,
            line=3,
            options={"accelerate_config": YAML_FSDP1},
        ),
        Invalid(
            """
            from peft import LoraConfig as LC
            from trl import SFTConfig, SFTTrainer
            expert_params = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
            peft_config = LC(r=32, target_parameters=expert_params)
            args = SFTConfig(output_dir="out", fsdp="full_shard auto_wrap", fsdp_config={"version": 1})
            SFTTrainer(model=model, args=args, peft_config=peft_config).train()
            """,
            line=4,
        ),
    ]

    AUDIT_VALID = [
        spec("mixtral", lora={"r": 8, "target_modules": ["w1", "w2", "w3"]}),
        spec("mixtral", lora={"r": 8, "target_modules": ["w1", "w2", "w3"]}, fsdp={"version": 2, "wrap": []}),
    ]
    AUDIT_INVALID = [
        spec("mixtral", lora={"r": 8, "target_modules": ["w1", "w2", "w3"]},
             fsdp={"version": 1, "use_orig_params": True}),
        spec("mixtral", lora={"r": 8, "target_modules": ["w1", "w2", "w3"]},
             fsdp={"version": 1, "auto_wrap_policy": "peft", "use_orig_params": True}),
        spec("mixtral", lora={"r": 8, "target_modules": ["w1", "w2", "w3"]},
             fsdp={"version": 2, "wrap": ["Linear", "MixtralDecoderLayer"]}),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        for call in a.calls("LoraConfig"):
            if not target_parameters(a, call):
                continue
            reason = _fsdp1_plan(a, call)
            if reason is not None:
                ctx.report(
                    call.kwarg("target_parameters") or call.node,
                    f"LoRA on target_parameters (lora.ParamWrapper) parametrizes the expert parameter during each "
                    f"forward, but {reason}: FSDP1 replaces that parameter with a view into its FlatParameter and "
                    f"the step fails (\"Output 0 of View is a view ... modified inplace\", or \"Module already has "
                    f"an attribute\" under peft's fsdp_auto_wrap_policy; peft#3080). Shard with FSDP2 instead: "
                    f"fully_shard per decoder layer, then the root (same gradients as without FSDP).",
                )

    def audit(self, ctx):
        import torch.nn as nn

        try:
            from peft.tuners.lora.layer import ParamWrapper
        except ImportError:  # peft < 0.17: no target_parameters
            return
        # By (module name, attribute): after fully_shard the modules hold DTensors, not the params seen before.
        info_of = {owner: p for p in ctx.params for owner in p.owners}
        names = {id(m): n for n, m in ctx.built.model.named_modules()}
        hits = []
        for name, mod in ctx.built.model.named_modules():
            if not isinstance(mod, ParamWrapper):
                continue
            read = []  # (what, ParamInfo): what ParamWrapper reads itself
            for attr in ("lora_A", "lora_B"):
                layer = getattr(mod, attr, None)
                if isinstance(layer, nn.ModuleDict):
                    read += [(f"{attr}.{k}.weight", info_of.get((f"{name}.{attr}.{k}", "weight"))) for k in layer]
            base = names.get(id(mod.get_base_layer()))
            read.append((mod.parameter_name, info_of.get((base, mod.parameter_name))))
            for what, info in read:
                if info is None or info.ignored:
                    continue
                for unit in ctx.plan.unit_of(info):
                    below = not (unit.name == "" or name == unit.name or name.startswith(unit.name + "."))
                    if below or (ctx.plan.version == 1 and what == mod.parameter_name):
                        hits.append((name, what, unit))
        if not hits:
            return
        if ctx.plan.version == 1:
            name, what, unit = next((h for h in hits if not h[1].startswith("lora_")), hits[0])
            wrappers = sorted({h[0] for h in hits})
            peft_policy = ctx.plan.policy == "peft"
            ctx.report(self, f"peft's ParamWrapper {_short(name)} parametrizes {what} during each forward, but FSDP1 "
                             f"flattens it into unit {_short(unit.label)}, whose original parameters are views into "
                             f"one FlatParameter: the step fails ("
                             + ("\"AssertionError: Module already has an attribute named ...\" with peft's "
                                "fsdp_auto_wrap_policy, which also gives each LoRA leaf a unit of its own"
                                if peft_policy else "\"RuntimeError: Output 0 of View is a view ... modified "
                                                    "inplace\"")
                             + f"; peft#3080). {len(wrappers)} ParamWrapper(s) are affected. Shard with FSDP2 "
                               f"instead: fully_shard per decoder layer, then the root (same gradients as without "
                               f"FSDP).", unit=unit.name, field="fsdp")
            return
        name, what, unit = hits[0]
        wrappers = sorted({h[0] for h in hits})
        units = sorted({h[2].label for h in hits})
        ctx.report(self, f"peft's ParamWrapper {_short(name)} reads {what} directly, but that parameter is in FSDP unit "
                         f"{_short(unit.label)}, rooted below the ParamWrapper: it is gathered only by that module's "
                         f"own pre-forward hook, after ParamWrapper has read it (the LoRA leaves are never called at "
                         f"all), so the adapter computation sees the shard and fails (\"aten.baddbmm.default got "
                         f"mixed torch.Tensor and DTensor\", peft#3080). {len(wrappers)} ParamWrapper(s) read "
                         f"parameters of {len(units)} such unit(s). "
                         f"Make the unit that holds the experts and their adapters the decoder layer (or another "
                         f"ancestor of the ParamWrapper): fully_shard per decoder layer, then the root.",
                   unit=unit.name, field="fsdp")


def _short(name: str) -> str:
    return name[len("base_model.model."):] if name.startswith("base_model.model.") else name


def _fsdp1_plan(a, call):
    """How the code at `call` runs under FSDP1; None when it does not (or the version is not known)."""
    if 1 in a.fsdp_at(call, launch=False):
        return "the model is wrapped with FSDP1 FullyShardedDataParallel"
    launch = getattr(a, "launch", None)
    if launch is None or launch.fsdp_version != 1:
        return None
    # TrainingArguments(fsdp=...) without a version: FSDP1 or FSDP2 depending on transformers (2 in 5.x).
    if launch.source is None and launch.get("version") is None:
        return None
    return "the launch config runs FSDP1"
