from fsdplint.apis import BOUNDARIES
from fsdplint.fixes import Replace, remove_keyword, safe
from fsdplint.findings import Applicability, Severity
from fsdplint.rule import Invalid, Rule, Valid

# pytorch#154704 / #155319 (June 2025): an explicit `reshard_after_forward=True` on the root is respected
# (before, the root was always kept unsharded), and `None` (the new default) means False on the root.
ROOT_RESHARD_RESPECTED_SINCE = BOUNDARIES["fully_shard_root_reshard_respected"].since  # read at 2.7.1 and 2.8.0


class RootReshardAfterForward(Rule):
    code = "FSDP015"
    name = "root-reshard-after-forward"
    severity = Severity.INFO
    sides = "S"
    fix = Applicability.SAFE
    versions = {"torch": ">=2.8"}
    summary = "`reshard_after_forward=True` on the root call (extra all-gather)."
    message = (
        "fully_shard(..., reshard_after_forward=True) on the root model: on {torch} the root's parameters are "
        "freed after forward and all-gathered again as soon as backward starts, an extra all-gather every step. "
        "Drop the argument (the default None keeps the root unsharded) and keep True on the layers only."
    )
    doc = """
    ## What it does
    Finds `fully_shard(model, reshard_after_forward=True)` on the root model after its layers were sharded
    with their own `fully_shard` calls.

    ## Why is this bad?
    The root unit (embeddings, final norm, LM head) is the first one backward needs. Resharding it after
    forward means FSDP frees it and immediately all-gathers it again: one extra collective per step, no
    memory saved in practice. Since pytorch#154704, `fully_shard` respects an explicit `True` on the root; the
    default `None` means True for layers and False for the root.

    ## Example
    ```python
    for layer in model.model.layers:
        fully_shard(layer, reshard_after_forward=True)
    fully_shard(model, reshard_after_forward=True)
    ```

    ## Use instead
    ```python
    for layer in model.model.layers:
        fully_shard(layer, reshard_after_forward=True)
    fully_shard(model)
    ```

    ## Fix safety
    Safe: the fix drops `reshard_after_forward=True` from the root call; on the affected torch releases the
    default (`None`) keeps the root unsharded after forward, which changes speed, not results.

    ## Versions
    torch >= 2.8 (pytorch#154704, #155319). Earlier releases kept the root unsharded regardless, so the
    argument was harmless there and this rule stays silent.

    ## References
    - pytorch `torch/distributed/fsdp/_fully_shard/_fully_shard.py` (docstring of `reshard_after_forward`)
    - pytorch#154655, pytorch#154704, pytorch#155319; torchtitan#1253
    - accelerate `utils/fsdp_utils.py` (leaves the root to the `None` default)
    """
    references = ("pytorch#154704", "pytorch#155319", "torchtitan#1253")

    VALID = [
        Valid(
            """
            from torch.distributed.fsdp import fully_shard
            for layer in model.model.layers:
                fully_shard(layer, reshard_after_forward=True)
            fully_shard(model)
            """,
            target={"torch": "2.8"},
        ),
        Valid(
            """
            from torch.distributed.fsdp import fully_shard
            for layer in model.model.layers:
                fully_shard(layer, reshard_after_forward=True)
            fully_shard(model, reshard_after_forward=False)
            """,
            target={"torch": "2.8"},
        ),
        # A root-only model: resharding it after forward is a deliberate memory trade-off.
        Valid(
            """
            from torch.distributed.fsdp import fully_shard
            fully_shard(text_encoder, reshard_after_forward=True)
            """,
            target={"torch": "2.8"},
        ),
        # torch 2.6 kept the root unsharded whatever the argument said.
        Valid(
            """
            from torch.distributed.fsdp import fully_shard
            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model, reshard_after_forward=True)
            """,
            target={"torch": "2.6"},
        ),
        # Value not known statically (torchtitan style).
        Valid(
            """
            from torch.distributed.fsdp import fully_shard
            for layer in model.layers:
                fully_shard(layer, reshard_after_forward=reshard)
            fully_shard(model, reshard_after_forward=not pp_enabled)
            """,
            target={"torch": "2.9"},
        ),
    ]
    INVALID = [
        Invalid(
            """
            from torch.distributed.fsdp import fully_shard
            for layer in model.model.layers:
                fully_shard(layer, reshard_after_forward=True)
            fully_shard(model, reshard_after_forward=True)
            """,
            target={"torch": "2.8"},
            line=4,
            expected_fix="""
            from torch.distributed.fsdp import fully_shard
            for layer in model.model.layers:
                fully_shard(layer, reshard_after_forward=True)
            fully_shard(model)
            """,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as f

            def shard(model, mesh):
                for block in model.layers:
                    f.fully_shard(block, mesh=mesh)
                f.fully_shard(model, mesh=mesh, reshard_after_forward=True, mp_policy=mp)
                return model
            """,
            target={"torch": "2.9"},
            line=6,
            expected_fix="""
            import torch.distributed.fsdp as f

            def shard(model, mesh):
                for block in model.layers:
                    f.fully_shard(block, mesh=mesh)
                f.fully_shard(model, mesh=mesh, mp_policy=mp)
                return model
            """,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import fully_shard as shard
            from peft import get_peft_model
            RESHARD = True
            model = get_peft_model(model, cfg)
            for layer in model.base_model.model.model.layers:
                shard(layer)
            model = shard(
                model,
                reshard_after_forward=RESHARD,
            )
            """,
            target={"torch": "2.10"},
            line=7,
        ),
    ]

    def check(self, ctx) -> None:
        tv = ctx.version("torch")
        if tv < ROOT_RESHARD_RESPECTED_SINCE:
            return
        a = ctx.analysis
        for t in a.timelines:
            for ev in t.of("shard2"):
                if ev.ref is None or ev.ref.child or ev.entity is None:
                    continue
                if not any(e.ref is not None and e.ref.child for e in t.before(ev, ("shard2",))):
                    continue  # root-only: resharding it is a memory choice, not a wasted all-gather
                call = ev.call
                arg = call.kwarg("reshard_after_forward")
                if arg is None or a.value(arg.value, call.scope) is not True:
                    continue
                text = remove_keyword(call.node, "reshard_after_forward")
                fix = safe("Drop reshard_after_forward=True from the root call", Replace(call.node, text)) if text else None
                ctx.report(call.node, self.message.format(torch=tv.describe()), fix=fix)
