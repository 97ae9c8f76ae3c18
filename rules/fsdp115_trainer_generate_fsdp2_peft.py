from fsdplint.analysis import UNKNOWN
from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid

# TRL trainers that call `model.generate()` on the training model inside the training loop.
_ONLINE = ("GRPOTrainer", "RLOOTrainer", "OnlineDPOTrainer", "PPOTrainer", "XPOTrainer", "NashMDTrainer")
# transformers#42436 (fixes transformers#42417): the Trainer registers `generate` as an FSDP forward method.
FIXED_IN = "5.0.0"

_YAML_FSDP2 = """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
num_processes: 8
"""


class TrainerGenerateFsdp2Peft(Rule):
    code = "FSDP115"
    name = "trainer-generate-fsdp2-peft"
    severity = Severity.ERROR
    sides = "S"
    summary = (
        "TRL online trainer (GRPO, RLOO, online DPO, ...) with a PEFT adapter under FSDP2 on transformers < 5.0: "
        "its internal generate() fails with `got mixed torch.Tensor and DTensor`"
    )
    versions = {"transformers": f"<{FIXED_IN}"}
    doc = """
    ## What it does
    Finds a TRL trainer that generates with the training model inside its loop (`GRPOTrainer`,
    `RLOOTrainer`, `OnlineDPOTrainer`, `PPOTrainer`, `XPOTrainer`, `NashMDTrainer`) given a LoRA adapter
    (`peft_config=` with a `LoraConfig` the script builds, or a PEFT model), launched with FSDP2 (`fsdp_version: 2`), without vLLM generation
    (`use_vllm=True`), when the target transformers is older than 5.0.0.

    ## Why is this bad?
    FSDP2 all-gathers a module's parameters only around `forward()`. These trainers call
    `model.generate()` on the sharded model to sample completions; before transformers 5.0.0 the Trainer did
    not register `generate` with FSDP, so generation mixes sharded DTensor parameters with plain tensors and
    the first step fails with `RuntimeError: aten.mm.default: got mixed torch.Tensor and DTensor, need to
    convert all torch.Tensor to DTensor before calling distributed operators!` (trl#4550,
    transformers#42417).

    ## Example
    ```python
    # fsdp.yaml: fsdp_version: 2 — transformers 4.57
    trainer = GRPOTrainer(model=model_id, reward_funcs=reward, args=GRPOConfig(...), peft_config=lora)
    trainer.train()
    ```

    ## Use instead
    Upgrade to transformers >= 5.0.0 (transformers#42436 calls
    `torch.distributed.fsdp.register_fsdp_forward_method(model, "generate")` when it prepares an FSDP
    model), or generate with vLLM (`GRPOConfig(use_vllm=True)`), or train with FSDP1.

    ## Fix safety
    No automatic fix: the remedy is a dependency upgrade or a different generation backend.

    ## Versions
    transformers < 5.0.0 (4.57.6, the last 4.x, lacks the registration; 5.0.0 and 5.24.0 have it in
    `Trainer._inner_training_loop`); FSDP2 reaches these trainers through accelerate >= 1.6.

    ## References
    - trl#4550 ("FSDP2+PEFT(LoRA)+GRPO result in `mixed torch.Tensor and DTensor`")
    - transformers#42417, fixed by transformers#42436
    - transformers src trainer.py (`register_fsdp_forward_method(self.model, "generate")`)
    """
    references = ("trl#4550", "transformers#42417", "transformers#42436")

    VALID = [
        # Fixed transformers: the Trainer registers generate with FSDP2.
        Valid(
            """
            from trl import GRPOConfig, GRPOTrainer
            trainer = GRPOTrainer(model=model_id, reward_funcs=reward, args=GRPOConfig("out"), peft_config=lora)
            trainer.train()
            """,
            target={"transformers": "5.0.0"},
            options={"accelerate_config": _YAML_FSDP2},
        ),
        # vLLM generates: the sharded model's generate() is never called.
        Valid(
            """
            from trl import GRPOConfig, GRPOTrainer
            args = GRPOConfig("out", use_vllm=True, vllm_mode="colocate")
            trainer = GRPOTrainer(model=model_id, reward_funcs=reward, args=args, peft_config=lora)
            trainer.train()
            """,
            target={"transformers": "4.57.1"},
            options={"accelerate_config": _YAML_FSDP2},
        ),
        # FSDP1: the trainer summons full parameters for generation.
        Valid(
            """
            from trl import GRPOConfig, GRPOTrainer
            trainer = GRPOTrainer(model=model_id, reward_funcs=reward, args=GRPOConfig("out"), peft_config=lora)
            trainer.train()
            """,
            target={"transformers": "4.57.1"},
            options={"accelerate_config": _YAML_FSDP2.replace("fsdp_version: 2", "fsdp_version: 1")},
        ),
        # Full fine-tuning without an adapter (the report needs LoRA).
        Valid(
            """
            from trl import GRPOConfig, GRPOTrainer
            trainer = GRPOTrainer(model=model_id, reward_funcs=reward, args=GRPOConfig("out"))
            trainer.train()
            """,
            target={"transformers": "4.57.1"},
            options={"accelerate_config": _YAML_FSDP2},
        ),
        # trl's get_peft_config returns None unless --use_peft: no LoRA config is visible.
        Valid(
            """
            from trl import GRPOConfig, GRPOTrainer, get_peft_config
            trainer = GRPOTrainer(model=model_id, reward_funcs=reward, args=GRPOConfig("out"),
                                  peft_config=get_peft_config(model_args))
            trainer.train()
            """,
            target={"transformers": "4.57.1"},
            options={"accelerate_config": _YAML_FSDP2},
        ),
        # SFT does not generate inside the loop.
        Valid(
            """
            from trl import SFTConfig, SFTTrainer
            trainer = SFTTrainer(model=model_id, args=SFTConfig("out"), train_dataset=ds, peft_config=lora)
            trainer.train()
            """,
            target={"transformers": "4.57.1"},
            options={"accelerate_config": _YAML_FSDP2},
        ),
    ]
    INVALID = [
        Invalid(
            """
            from peft import LoraConfig
            from trl import GRPOConfig, GRPOTrainer
            lora = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
            trainer = GRPOTrainer(model=model_id, reward_funcs=reward, args=GRPOConfig("out"), peft_config=lora)
            trainer.train()
            """,
            target={"transformers": "4.57.1"},
            options={"accelerate_config": _YAML_FSDP2},
            line=4,
        ),
        Invalid(
            """
            import trl
            from peft import get_peft_model

            def main(model, cfg):
                model = get_peft_model(model, cfg)
                args = trl.GRPOConfig("out", fsdp="full_shard auto_wrap", fsdp_config={"version": 2})
                trainer = trl.RLOOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds)
                trainer.train()
            """,
            target={"transformers": "4.56.2"},
            line=7,
        ),
        Invalid(
            """
            from peft import LoraConfig
            from trl import OnlineDPOTrainer as Online
            lora_config = LoraConfig(r=16, target_modules="all-linear")
            trainer = Online(model=model, judge=judge, args=args, train_dataset=ds, peft_config=lora_config)
            trainer.train()
            """,
            options={"accelerate_config": _YAML_FSDP2},
            line=4,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        if a.launch_fsdp_version != 2:
            return
        tv = ctx.version("transformers")
        if not tv < FIXED_IN:
            return
        if any(a.value(c.kw("use_vllm"), c.scope) is True for c in a.calls("TrainingArguments")):
            return
        for call in a.c.calls:
            name = _online_trainer(call)
            if name is None:
                continue
            peft = call.kw("peft_config")
            # A LoraConfig the file builds; `peft_config=get_peft_config(args)` may be None (no LoRA): stay silent.
            has_adapter = peft is not None and a.value(peft, call.scope) is not None and (
                a.call_for(peft, call.scope, "LoraConfig") is not None or bool(a.calls("LoraConfig")))
            if not has_adapter:
                model = call.arg(0, "model")
                has_adapter = model is not None and a.value(model, call.scope) is UNKNOWN and bool(
                    a.calls("get_peft_model", "PeftModel_from_pretrained"))
            if not has_adapter:
                continue
            ctx.report(
                call.node,
                f"{name} generates completions with the training model's generate() inside its loop; with a LoRA "
                f"adapter under FSDP2 and {tv.describe()}, the Trainer does not register generate() with FSDP, so "
                "generation runs on sharded parameters and fails with \"RuntimeError: aten.mm.default: got mixed "
                "torch.Tensor and DTensor\" (trl#4550, transformers#42417). Upgrade to transformers >= 5.0.0 "
                "(transformers#42436), or generate with vLLM (use_vllm=True), or use FSDP1.",
            )


def _online_trainer(call):
    q = call.qualname or ""
    if not q.startswith("trl."):
        return None
    last = q.rsplit(".", 1)[-1]
    return last if last in _ONLINE else None
