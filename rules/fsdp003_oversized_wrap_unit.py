from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.rule import Rule

# A non-root unit holding more than this share of all parameters defeats sharding.
MAX_UNIT_SHARE = 0.5


class OversizedWrapUnit(Rule):
    code = "FSDP003"
    name = "oversized-wrap-unit"
    severity = Severity.WARNING
    summary = "FSDP1 without an auto-wrap policy, or a policy that matches nothing: the whole model is one unit"
    sides = "SA"
    doc = """
    ## What it does
    Finds FSDP plans where one unit holds most of the model: FSDP1 without an auto-wrap policy, a policy
    whose classes match no module (e.g. `modules_to_save` wrappers that fail a class match), or a wrap
    class that is a container of the whole model.

    ## Why is this bad?
    A unit is all-gathered as a whole for its forward and backward: with one giant unit each rank holds
    the full model during compute and FSDP saves nothing. It usually ends in an out-of-memory error.

    ## Example
    ```python
    model = FSDP(model)  # no auto_wrap_policy
    ```

    ## Use instead
    ```python
    policy = ModuleWrapPolicy({LlamaDecoderLayer})
    model = FSDP(model, auto_wrap_policy=policy)
    ```

    ## Fix safety
    No automatic fix.

    ## Versions
    All versions.

    ## References
    - verl#5516
    - torch `_fully_shard.py` docstring
    """
    AUDIT_VALID = [spec(fsdp={"version": 1, "use_orig_params": True}), spec()]
    AUDIT_INVALID = [
        spec(fsdp={"version": 1, "auto_wrap_policy": "NO_WRAP", "use_orig_params": True}),
        spec(fsdp={"version": 1, "wrap": ["NoSuchDecoderLayer"], "use_orig_params": True}),
        spec(fsdp={"wrap": ["LlamaModel"]}),
    ]

    def audit(self, ctx):
        plan = ctx.plan
        total = sum(p.numel for p in ctx.params) or 1
        if plan.version == 1 and len(plan.units) == 1:
            why = (f"the wrap classes {plan.wrap_unmatched} match no module of {ctx.built.architecture}"
                   if plan.wrap_unmatched else f"the auto-wrap policy ({plan.policy}) selects no module")
            ctx.report(self, f"the FSDP1 plan has a single unit, the root ({why}): all {total:,} parameters "
                             f"are all-gathered together. Pass auto_wrap_policy=ModuleWrapPolicy("
                             f"{{{', '.join(ctx.built.no_split_modules) or 'the transformer block class'}}}).",
                       field="fsdp")
            return
        for unit in plan.units:
            if unit.name and unit.numel > MAX_UNIT_SHARE * total:
                ctx.report(self, f"FSDP unit {unit.label} ({unit.cls}) holds {unit.numel:,} of {total:,} "
                                 f"parameters ({100 * unit.numel / total:.0f}%): it is all-gathered as a whole, "
                                 f"so sharding saves little. Wrap smaller modules (the transformer blocks).",
                           unit=unit.name, field="fsdp.wrap")
