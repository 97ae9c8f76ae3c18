from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.rule import Rule


class FullyShardIgnoredParams(Rule):
    code = "FSDP001"
    name = "fully-shard-ignored-params"
    severity = Severity.ERROR
    summary = (
        "`ignored_params` passed to `fully_shard` on torch < 2.7 (TypeError); on >= 2.7 an ignored param "
        "that is trainable is never reduced"
    )
    sides = "SA"
    versions = {"torch": ">=2.4"}
    doc = """
    ## What it does
    Checks the parameters given to FSDP2's `fully_shard(..., ignored_params=...)`: the argument only
    exists from torch 2.7.0, and an ignored parameter must be frozen.

    ## Why is this bad?
    On torch <= 2.6 `fully_shard` raises `TypeError: fully_shard() got an unexpected keyword argument
    'ignored_params'`. On >= 2.7, ignored parameters are "not sharded, nor moved to the device during
    init, nor have their gradients reduced": a *trainable* ignored parameter gets a different update on
    every rank and the replicas silently diverge.

    ## Example
    ```python
    fully_shard(model, ignored_params={p for n, p in model.named_parameters() if "lora_" in n})
    ```

    ## Use instead
    ```python
    frozen_4bit = {p for p in model.parameters() if not p.requires_grad and type(p).__name__ == "Params4bit"}
    kwargs = {"ignored_params": frozen_4bit} if torch_version >= (2, 7) else {}
    fully_shard(model, **kwargs)
    ```
    Move ignored parameters to the device yourself.

    ## Fix safety
    No automatic fix: which parameters to ignore is a design decision.

    ## Versions
    `ignored_params` was added to FSDP2 in torch 2.7.0 (pytorch#146631); accelerate and TRL gate it on
    `>= 2.7.0`.

    ## References
    - pytorch#146631, pytorch#148242, pytorch#149074
    - accelerate#3924, trl#7259
    """
    references = ("https://github.com/pytorch/pytorch/pull/146631",
                  "https://github.com/pytorch/pytorch/issues/149074")

    AUDIT_VALID = [
        spec(quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"},
             fsdp={"ignored_params": "4bit"}),
        spec(),
    ]
    AUDIT_INVALID = [
        spec(fsdp={"ignored_params": ["*lora_A*"]}),
        spec(quantization={"load_in_4bit": True}, fsdp={"ignored_params": "4bit", "torch": "2.6"}),
    ]

    def audit(self, ctx):
        ctx.report_problems(self)
        plan = ctx.plan
        if not plan.ignored:
            return
        if plan.version == 2 and not ctx.torch_at_least("2.7"):
            ctx.report(self, f"fully_shard(ignored_params=...) needs torch >= 2.7; torch {ctx.torch_version} "
                             f"({ctx.torch_version_source}) raises TypeError: fully_shard() got an unexpected "
                             f"keyword argument 'ignored_params'. Upgrade torch, or pass it only when "
                             f"torch >= 2.7.", field="fsdp.ignored_params")
        trainable = [p for p in plan.ignored if p.requires_grad]
        if trainable:
            names = ", ".join(p.fqn for p in trainable[:3]) + (", ..." if len(trainable) > 3 else "")
            ctx.report(self, f"{len(trainable)} trainable parameter(s) are in ignored_params ({names}): FSDP "
                             f"neither shards them nor reduces their gradients, so every rank trains its own "
                             f"copy and the replicas diverge. Ignore only frozen parameters (e.g. the 4-bit "
                             f"base weights).", field="fsdp.ignored_params", param=trainable[0].fqn)
