from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.rule import Rule

_MIXTRAL_EXPERT_LORA = {"r": 8, "target_modules": ["q_proj"], "target_parameters": ["mlp.experts.gate_up_proj"],
                        "lora_dropout": 0.0}


class LoraLeafUnits(Rule):
    code = "FSDP111"
    name = "lora-leaf-units"
    severity = Severity.WARNING
    summary = "LoRA A/B made into their own FSDP2 units while consumers read weights directly"
    sides = "A"
    versions = {"torch": ">=2.4"}
    doc = """
    ## What it does
    Runs the FSDP2 plan and finds units made of the inside of a peft LoRA layer — its `lora_A`/`lora_B`
    modules or its `base_layer` — when the LoRA layer reads those weights directly instead of calling
    the module:

    - `lora.ParamWrapper` (peft `target_parameters`, e.g. fused MoE experts) folds
      `lora_B.weight @ lora_A.weight` into the wrapped parameter in its own forward;
    - DoRA (`use_dora=True`) reads `base_layer.weight` to compute the weight norm.

    This typically happens when `fully_shard` is applied per `nn.Linear` (a `wrap` list containing
    `Linear`), or to every module with trainable parameters.

    ## Why is this bad?
    An FSDP2 unit all-gathers its parameters only around its *own* forward. A weight read directly by
    another module is still the sharded `DTensor` at that point: the computation fails with a shape or
    DTensor/Tensor mixing error, or sees only the local shard. Even where it works, each tiny unit adds an
    all-gather and a reduce-scatter per step.

    ## Example
    ```python
    config = LoraConfig(target_parameters=["mlp.experts.gate_up_proj"], lora_dropout=0.0)
    model = get_peft_model(model, config)
    for module in model.modules():
        if isinstance(module, nn.Linear):      # includes lora_A / lora_B
            fully_shard(module)
    fully_shard(model)
    ```

    ## Use instead
    ```python
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)                     # LoRA stays in its decoder layer's unit
    fully_shard(model)
    ```

    ## Fix safety
    No automatic fix.

    ## Versions
    FSDP2 (`fully_shard`, torch >= 2.4), peft >= 0.17 for `target_parameters`, all peft versions with DoRA.

    ## References
    - axolotl#2992 (LoRA kernels reading sharded weights under FSDP2)
    - peft#3080 (`target_parameters` under FSDP)
    - peft `tuners/lora/layer.py` (`ParamWrapper.get_delta_weight`), `tuners/lora/dora.py`
    """
    AUDIT_VALID = [
        spec(),
        # peft's own Linear calls lora_A/lora_B as modules: separate units still unshard in time.
        spec(fsdp={"wrap": ["LlamaDecoderLayer", "Linear"]}),
        spec("mixtral", lora=_MIXTRAL_EXPERT_LORA),
    ]
    AUDIT_INVALID = [
        spec("mixtral", lora=_MIXTRAL_EXPERT_LORA, fsdp={"wrap": ["MixtralDecoderLayer", "Linear"]}),
        spec(lora={"r": 8, "target_modules": ["q_proj", "v_proj"], "use_dora": True},
             fsdp={"wrap": ["LlamaDecoderLayer", "Linear"]}),
    ]

    def audit(self, ctx):
        if ctx.plan.version != 2:
            return
        try:
            from peft.tuners.lora.layer import LoraLayer
        except ImportError:  # pragma: no cover - peft is part of the model stack
            return
        try:
            from peft.tuners.lora.layer import ParamWrapper
        except ImportError:  # peft < 0.17: no target_parameters
            ParamWrapper = ()
        modules = dict(ctx.built.model.named_modules())
        tuners = {n: m for n, m in modules.items() if isinstance(m, LoraLayer)}
        hits = []  # (unit name, tuner name, what reads it)
        for unit in ctx.plan.units:
            if not unit.name:
                continue
            owner = _nearest_tuner(unit.name, tuners)
            if owner is None:
                continue
            tuner = tuners[owner]
            inner = unit.name[len(owner) + 1:]
            if isinstance(tuner, ParamWrapper) and inner.startswith(("lora_A", "lora_B")):
                hits.append((unit.name, owner, "lora.ParamWrapper folds lora_B.weight @ lora_A.weight into "
                                                "the wrapped parameter without calling them"))
            elif inner.startswith("base_layer") and any(getattr(tuner, "use_dora", {}).values()):
                hits.append((unit.name, owner, "DoRA reads base_layer.weight directly for the weight norm"))
        if not hits:
            return
        first, _, why = hits[0]
        more = f" ({len(hits)} such units in all)" if len(hits) > 1 else ""
        ctx.report(self, f"FSDP2 unit {first} is part of a LoRA layer whose forward reads its weights directly "
                         f"({why}){more}: a unit is all-gathered only around its own forward, so the LoRA layer "
                         f"sees the sharded DTensor and fails or computes with one shard. Keep LoRA layers inside "
                         f"their decoder layer's unit: do not fully_shard lora_A/lora_B/base_layer (e.g. drop "
                         f"'Linear' from the wrapped classes).", unit=first, field="fsdp.wrap")


def _nearest_tuner(name: str, tuners: dict):
    """The innermost LoRA layer strictly containing module `name`, if any."""
    parts = name.split(".")
    for n in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in tuners:
            return prefix
    return None
