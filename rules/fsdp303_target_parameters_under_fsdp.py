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


class TargetParametersUnderFsdp(Rule):
    code = "FSDP303"
    name = "target-parameters-under-fsdp"
    severity = Severity.ERROR
    summary = "peft `target_parameters` (ParamWrapper) combined with FSDP (peft#3080)."
    sides = "S"
    versions = {"peft": ">=0.17.0"}
    doc = """
    ## What it does
    Finds a `LoraConfig(target_parameters=[...])` in a script that shards the model with FSDP
    (`FullyShardedDataParallel`, `fully_shard`, an accelerate FSDP config or `TrainingArguments(fsdp=...)`).

    ## Why is this bad?
    `target_parameters` LoRA (`lora.ParamWrapper`, used for fused MoE experts) reads the wrapped parameter
    directly with its full shape. Under FSDP that parameter is a flat shard or a DTensor shard, so the
    adapter computation fails, e.g. `RuntimeError: shape '[128, -1, …]' is invalid for input of size …`.
    The issue is open upstream (peft#3080).

    ## Example
    ```python
    LoraConfig(target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    # + FSDP
    ```

    ## Use instead
    Train expert LoRA without FSDP (DDP, or one GPU), or target only the attention/shared modules with
    `target_modules` under FSDP until peft#3080 is fixed.

    ## Fix safety
    No automatic fix.

    ## Versions
    peft >= 0.17.0 (where `target_parameters` exists); open as of peft 0.21.

    ## References
    - peft#3080, #2638, #3009, #3711; axolotl#2992
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
    ]
    INVALID = [
        Invalid(
            """
            from peft import LoraConfig, get_peft_model
            from torch.distributed.fsdp import fully_shard
            cfg = LoraConfig(r=16, target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
            model = get_peft_model(model, cfg)
            for layer in model.base_model.model.model.layers:
                fully_shard(layer)
            fully_shard(model)
            """,
            line=3,
        ),
        Invalid(
            """
            import peft
            cfg = peft.LoraConfig(r=16, target_parameters=["experts.gate_up_proj"])
            """,
            line=2,
            options={"accelerate_config": YAML_FSDP2},
        ),
        Invalid(
            """
            from peft import LoraConfig as LC
            from trl import SFTConfig
            expert_params = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
            peft_config = LC(r=32, target_parameters=expert_params)
            args = SFTConfig(output_dir="out", fsdp="full_shard auto_wrap")
            """,
            line=4,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        for call in a.calls("LoraConfig"):
            if a.fsdp_at(call) and target_parameters(a, call):
                ctx.report(
                    call.kwarg("target_parameters") or call.node,
                    "LoRA on target_parameters (lora.ParamWrapper) reads the full parameter, but FSDP shards it: "
                    "the adapter forward fails (e.g. RuntimeError: shape '[...]' is invalid) — peft#3080 is open. "
                    "Train expert LoRA without FSDP, or use target_modules only under FSDP.",
                )
