from fsdplint.audit.examples import spec, tiny
from fsdplint.findings import Severity
from fsdplint.rule import Rule

# Target names that show the user meant to adapt the MLP / experts, not only attention.
_MLP_NAMES = {"w1", "w2", "w3", "gate_proj", "up_proj", "down_proj", "gate_up_proj", "experts", "mlp",
              "fc1", "fc2", "c_fc", "dense_h_to_4h", "dense_4h_to_h", "all-linear"}


class ExpertsAsBareParameters(Rule):
    code = "FSDP301"
    name = "experts-as-bare-parameters"
    severity = Severity.ERROR
    summary = (
        "MoE experts stored as nn.Parameter / nn.ParameterList / fused 3-D tensors: LoRA `target_modules` "
        "cannot reach them and FSDP1 cannot wrap per expert"
    )
    sides = "SA"
    versions = {"peft": ">=0.13", "transformers": ">=4.45"}
    doc = """
    ## What it does
    Finds MoE expert weights that are bare parameters — fused 3-D tensors (Mixtral, Qwen3-MoE and GPT-OSS
    in transformers 5) or `nn.ParameterList` entries — that the LoRA config meant to adapt (its targets
    name MLP projections, or `"all-linear"`) but that received no adapter.

    ## Why is this bad?
    LoRA `target_modules` only wraps modules; a bare expert parameter has none. peft either raises
    (`Target modules {'gate_proj', ...} not found`), or silently adapts attention and shared experts only
    (`"all-linear"` on GPT-OSS), so the routed experts never train. FSDP units are modules too: all experts
    of a layer land in one unit.

    ## Example
    ```python
    LoraConfig(target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"])  # GPT-OSS
    ```

    ## Use instead
    ```python
    LoraConfig(target_modules=["q_proj", "v_proj"],
               target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], lora_dropout=0.0)
    ```
    (peft >= 0.17; `target_parameters` under FSDP is still broken, see FSDP303.)

    ## Fix safety
    No automatic fix.

    ## Versions
    peft >= 0.17 has `target_parameters`; peft >= 0.19 rewrites Mixtral/Qwen-MoE v4 expert names into
    `target_parameters` by itself; transformers v5 fuses experts into 3-D parameters.

    ## References
    - peft#2638, peft#3009, peft#3080, peft#3711
    - peft docs package_reference/lora.md
    """
    AUDIT_VALID = [
        spec("mixtral", lora={"r": 8, "target_modules": ["w1", "w2", "w3"]}),
        spec("mixtral"),
    ]
    AUDIT_INVALID = [
        spec(model={"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": 64,
                    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "num_local_experts": 4,
                    "layer_types": ["sliding_attention", "full_attention"], "torch_dtype": "bfloat16"},
             lora={"r": 8, "target_modules": "all-linear"}),
        spec("qwen3_moe", lora={"r": 8, "target_modules": ["q_proj", "experts"]}),
    ]

    def audit(self, ctx):
        ctx.report_problems(self)
        built = ctx.built
        if built.lora_config is None:
            return
        targets = set(built.user_targets or [])
        unmatched = {c.target for c in built.coverage if c.modules == 0}
        if not (targets & _MLP_NAMES or unmatched):
            return  # attention-only LoRA on an MoE model is a legitimate choice
        missed = [p for p in ctx.params if p.expert and not p.lora_reached and not p.requires_grad]
        if not missed:
            return
        first = missed[0]
        lists = any(p.owners and _is_list(ctx, p) for p in missed)
        suffixes = sorted({".".join(p.fqn.split(".")[-3:]) for p in missed})[:3]
        fsdp1 = (" FSDP1 cannot wrap single experts either: all experts of a layer form one unit."
                 if ctx.plan.version == 1 else "")
        ctx.report(self, f"{len(missed)} MoE expert parameters (e.g. {first.fqn}, shape {tuple(first.shape)}) are "
                         f"bare {'nn.ParameterList entries' if lists else 'fused nn.Parameters'} that LoRA "
                         f"target_modules {sorted(targets)} cannot reach: the routed experts get no adapter and "
                         f"do not train. peft >= 0.17 can adapt them with target_parameters="
                         f"{suffixes} and lora_dropout=0 (not yet under FSDP, see FSDP303).{fsdp1}",
                   param=first.fqn, field="lora.target_modules")


def _is_list(ctx, info) -> bool:
    import torch.nn as nn

    mods = dict(ctx.built.model.named_modules())
    return any(isinstance(mods.get(m), (nn.ParameterList, nn.ParameterDict)) for m, _ in info.owners)
