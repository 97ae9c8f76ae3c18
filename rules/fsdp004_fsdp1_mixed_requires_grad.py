from fsdplint.audit.examples import spec
from fsdplint.findings import Applicability, Severity
from fsdplint.rule import Rule


class Fsdp1MixedRequiresGrad(Rule):
    code = "FSDP004"
    name = "fsdp1-mixed-requires-grad"
    severity = Severity.ERROR
    summary = (
        "FSDP1 unit mixing frozen base and trainable LoRA params with use_orig_params=False "
        "(torch 2.0: even with True)"
    )
    sides = "SA"
    fix = Applicability.UNSAFE
    versions = {"torch": ">=2.0"}
    doc = """
    ## What it does
    Simulates the FSDP1 auto-wrap policy and checks that every unit's parameters are uniformly frozen or
    uniformly trainable when `use_orig_params=False`.

    ## Why is this bad?
    One FSDP1 unit is one `FlatParameter` with a single `requires_grad`. A decoder layer holding the frozen
    base weights and the trainable LoRA matrices cannot be flattened: torch raises `ValueError: <module>
    has both parameters with requires_grad=True and False. FSDP does not support wrapping such modules
    when use_orig_params=False.` (torch >= 2.1; torch 2.0 refuses even with `use_orig_params=True`).
    With `use_orig_params=True` it works, but gradient memory is that of the whole unit.

    ## Example
    ```python
    model = get_peft_model(model, LoraConfig(target_modules=["q_proj", "v_proj"]))
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}))
    ```

    ## Use instead
    ```python
    from peft.utils.other import fsdp_auto_wrap_policy
    model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=False)
    ```
    peft's policy wraps each trainable LoRA leaf in its own unit.

    ## Fix safety
    Unsafe: changing the wrap policy changes the sharding layout and checkpoint structure.

    ## Versions
    torch 2.0: no escape (pytorch#100945); torch >= 2.1 allows mixing with `use_orig_params=True`
    (pytorch#98221).

    ## References
    - pytorch#100945, pytorch#98221, pytorch#104690
    - peft#1702; peft `fsdp_auto_wrap_policy` (peft/utils/other.py)
    """
    AUDIT_VALID = [
        spec(fsdp={"version": 1, "auto_wrap_policy": "peft"}),
        spec(fsdp={"version": 1, "use_orig_params": True}),
    ]
    AUDIT_INVALID = [
        spec(fsdp={"version": 1}),
        spec(fsdp={"version": 1, "use_orig_params": True, "torch": "2.0"}),
    ]

    def audit(self, ctx):
        plan = ctx.plan
        if plan.version != 1:
            return
        hint = (" Use peft's fsdp_auto_wrap_policy(model) so each LoRA layer gets its own unit, or "
                "use_orig_params=True (torch >= 2.1, at the cost of full-unit gradient memory).")
        for message, unit, _ in ctx.problems(self.code):
            ctx.report(self, f"FSDP1 would raise ValueError: {message}{hint}", unit=unit,
                       field="fsdp.use_orig_params")
        if plan.use_orig_params and not ctx.torch_at_least("2.1"):
            for unit in plan.units:
                if len({p.requires_grad for p in unit.params}) > 1:
                    ctx.report(self, f"torch {ctx.torch_version} ({ctx.torch_version_source}) requires uniform "
                                     f"requires_grad in every FSDP unit even with use_orig_params=True "
                                     f"(\"FlatParameter requires uniform requires_grad\"); unit {unit.label} "
                                     f"mixes frozen and trainable parameters. Upgrade to torch >= 2.1 or use "
                                     f"peft's fsdp_auto_wrap_policy.", unit=unit.name, field="fsdp")
