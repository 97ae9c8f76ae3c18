from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.rule import Rule


class UnmanagedTrainableParam(Rule):
    code = "FSDP016"
    name = "unmanaged-trainable-param"
    severity = Severity.ERROR
    summary = "a trainable param outside every FSDP unit (and not ignored): its gradient is never reduced, ranks diverge"
    sides = "AR"
    doc = """
    ## What it does
    Finds trainable parameters that no FSDP unit manages and that are not in `ignored_params`: typically
    `fully_shard` applied to the decoder layers but not to the root, while `lm_head` or a
    `modules_to_save` copy is trainable.

    ## Why is this bad?
    FSDP only reduces gradients of the parameters it manages. An unmanaged trainable parameter gets a
    different gradient on every rank, so the replicas silently diverge, and the saved checkpoint holds
    rank 0's copy only.

    ## Example
    ```python
    model = get_peft_model(model, LoraConfig(target_modules=["q_proj", "lm_head"]))
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)
    # no fully_shard(model)
    ```

    ## Use instead
    ```python
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    ```

    ## Fix safety
    No automatic fix.

    ## Versions
    All versions.

    ## References
    - torch `_fully_shard.py` docstring
    - transformers#48792 (comment), FastVideo#1666
    """
    AUDIT_VALID = [spec(), spec(fsdp={"shard_root": False})]
    AUDIT_INVALID = [spec(lora={"r": 8, "target_modules": ["q_proj", "lm_head"]}, fsdp={"shard_root": False})]

    def audit(self, ctx):
        trainable = [p for p in ctx.plan.unmanaged if p.requires_grad]
        if not trainable:
            return
        names = ", ".join(p.fqn for p in trainable[:3]) + (", ..." if len(trainable) > 3 else "")
        ctx.report(self, f"{len(trainable)} trainable parameter(s) are outside every FSDP unit and not ignored "
                         f"({names}): their gradients are never all-reduced, so ranks diverge. Apply "
                         f"fully_shard to the root (or a module containing them) after the layers.",
                   param=trainable[0].fqn, field="fsdp")
