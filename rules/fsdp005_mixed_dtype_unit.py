from fsdplint.audit.examples import spec
from fsdplint.audit.params import dtype_name
from fsdplint.findings import Applicability, Severity
from fsdplint.rule import Rule

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
    sides = "SA"
    fix = Applicability.UNSAFE
    versions = {"torch": ">=2.4"}
    doc = """
    ## What it does
    Checks the dtypes inside each planned FSDP unit: FSDP1 flattens a unit into one `FlatParameter`, which
    needs one floating dtype; FSDP2 needs one original dtype among the trainable parameters of a group
    (all parameters on torch releases before pytorch#154103).

    ## Why is this bad?
    peft's `get_peft_model(autocast_adapter_dtype=True)` keeps LoRA weights in float32 next to a bfloat16
    base, `modules_to_save` copies stay in the base dtype, and `prepare_model_for_kbit_training` upcasts
    norms. FSDP1 raises `ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and
    torch.float32`; FSDP2 raises `AssertionError: FSDP expects uniform original parameter dtype but got
    {torch.bfloat16, torch.float32}` at the first forward.

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

    def audit(self, ctx):
        plan = ctx.plan
        for message, unit, _ in ctx.problems(self.code):
            if plan.version == 1:
                message = f"FSDP1 would raise ValueError: {message}"
            else:
                message = f"FSDP2 raises at the first forward: {message} (unit {unit or '(root)'})"
            ctx.report(self, message + ". Cast the model to one dtype before wrapping, or put parameters "
                                      "of another dtype in their own unit.", unit=unit, field="fsdp")
        if plan.version == 2 and not ctx.torch_at_least(FROZEN_DTYPES_RELAXED_IN):
            for unit in plan.units:
                dtypes = {p.dtype for p in unit.params if p.kind != "4bit"}
                if len(dtypes) > 1 and len({p.dtype for p in unit.params if p.requires_grad}) <= 1:
                    names = sorted(dtype_name(d) for d in dtypes)
                    ctx.report(self, f"FSDP2 unit {unit.label} mixes dtypes {names}: torch "
                                     f"{ctx.torch_version} ({ctx.torch_version_source}) requires one dtype for "
                                     f"all parameters of a unit, frozen ones included (relaxed by "
                                     f"pytorch#154103), and raises \"FSDP expects uniform original parameter "
                                     f"dtype\". Cast the model to one dtype before fully_shard.",
                               unit=unit.name, field="fsdp")
