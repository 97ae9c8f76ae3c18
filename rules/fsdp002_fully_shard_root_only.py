from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.rule import Rule


class FullyShardRootOnly(Rule):
    code = "FSDP002"
    name = "fully-shard-root-only"
    severity = Severity.WARNING
    summary = "FSDP2 applied only to the root, or root before children: one giant unit, no memory saving"
    sides = "SA"
    doc = """
    ## What it does
    Finds FSDP2 plans where `fully_shard` is applied only to the root module (or to the root before its
    children), so one FSDP unit holds every parameter.

    ## Why is this bad?
    FSDP2 all-gathers a whole unit for its forward and backward. With a single unit every rank
    materializes the full model at once: no memory saving over DDP, and no overlap of communication with
    compute. `fully_shard`'s docstring says to call it bottom-up and "should *not* call fully_shard only on
    the topmost root".

    ## Example
    ```python
    fully_shard(model)
    ```

    ## Use instead
    ```python
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    ```

    ## Fix safety
    The rewrite is offered as unsafe: which modules to shard depends on the architecture.

    ## Versions
    torch >= 2.4 (FSDP2).

    ## References
    - torch `_fully_shard.py` docstring; torchtitan docs/fsdp.md
    """
    AUDIT_VALID = [spec()]
    AUDIT_INVALID = [spec(fsdp={"wrap": []}), spec(fsdp={"wrap": ["NoSuchDecoderLayer"]})]

    def audit(self, ctx):
        plan = ctx.plan
        if plan.version != 2 or len(plan.units) != 1 or plan.units[0].name != "":
            return
        why = (f"the wrap classes {plan.wrap_unmatched} match no module of {ctx.built.architecture}"
               if plan.wrap_unmatched else "no module below the root was sharded")
        ctx.report(self, f"fully_shard was applied only to the root ({why}): one FSDP unit holds all "
                         f"{plan.units[0].numel:,} parameters, so every rank all-gathers the whole model in "
                         f"forward and backward. Apply fully_shard to each "
                         f"{' / '.join(ctx.built.no_split_modules) or 'transformer block'} first, then the root.",
                   field="fsdp.wrap")
