from fsdplint.findings import Severity
from fsdplint.rule import Rule


class ParamsNotUpdatedAtStep(Rule):
    code = "FSDP504"
    name = "params-not-updated-at-step"
    severity = Severity.WARNING
    sides = "R"
    summary = "Trainable parameters the first optimizer step leaves unchanged: not in the optimizer, or no gradient reached them."
    doc = """
    ## What it does
    `fsdplint run` only: at the job's first `optimizer.step()`, after its real forward and backward,
    lists the trainable parameters (`requires_grad=True`) of the wrapped model that the optimizer
    does not hold, and those it holds whose gradient is still `None`.

    ## Why is this bad?
    Nothing fails. An optimizer built before `get_peft_model()` (or from a filtered list that misses
    the adapters) holds only frozen base weights: the LoRA weights never change and the saved adapter
    is its initial value. A parameter whose gradient never arrives (the loss does not depend on it, or
    reentrant checkpointing cut the graph) is not updated either.

    ## Example
    ```python
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)  # base model: frozen after LoRA
    model = get_peft_model(model, LoraConfig(target_modules=["q_proj"]))
    fully_shard(model)
    ```

    ## Use instead
    Build the optimizer after `get_peft_model()` and the wrap, from `model.parameters()`.

    ## Fix safety
    No fix.

    ## Versions
    All versions.

    ## References
    - torch `Optimizer.step` updates only the tensors in its `param_groups` that have a `.grad`.
    """
    references = ()
