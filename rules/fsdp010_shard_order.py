from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule


class ShardOrder(Rule):
    code = "FSDP010"
    name = "shard-order"
    severity = Severity.WARNING
    sides = "S"
    versions = {"torch": ">=2.4"}
    summary = "Activation checkpointing / torch.compile / fully_shard applied in a non-canonical order."
    message_ac_after_shard = (
        "Activation checkpointing is applied after fully_shard (line {line}). FSDP2's recipe is activation "
        "checkpointing, then per-block torch.compile, then fully_shard on each block and the root: wrapping "
        "already-sharded modules puts the checkpoint around FSDP's hooks, so recomputation and the all-gathers "
        "interleave in ways FSDP2 does not plan for. Apply checkpointing before fully_shard."
    )
    message_ac_before_wrap1 = (
        "Activation checkpointing is applied before FullyShardedDataParallel wraps the model (line {line}). "
        "FSDP1's recipe is the opposite: wrap first, then apply_activation_checkpointing(model, "
        "checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT), "
        "check_fn=...), so that each checkpointed block sits inside its FSDP unit."
    )
    message_compile_fsdp1 = (
        "torch.compile on a FullyShardedDataParallel model built without use_orig_params=True (line {line}): "
        "Dynamo only supports FSDP1 with use_orig_params=True and otherwise graph-breaks around every FSDP "
        "module, so nothing gets compiled. Pass use_orig_params=True to FullyShardedDataParallel."
    )
    doc = """
    ## What it does
    Checks the order of activation checkpointing (AC), `torch.compile` and FSDP wrapping:
    - FSDP2: AC applied to a model or block after `fully_shard` was applied to it;
    - FSDP1: AC applied before `FullyShardedDataParallel` wraps the model;
    - FSDP1: `torch.compile` on a model wrapped without `use_orig_params=True`.

    ## Why is this bad?
    FSDP2's canonical recipe (torchtitan, accelerate) is AC → per-block `torch.compile` → `fully_shard` on
    each block → `fully_shard` on the root; accelerate applies AC first "to make sure AC + fully_shard will
    work as expected". FSDP1's recipe wraps first and then applies non-reentrant AC inside the units.
    Dynamo only supports FSDP1 with `use_orig_params=True`: otherwise it graph-breaks on every FSDP module,
    and compilation does nothing but cost time.

    ## Example
    ```python
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    apply_activation_checkpointing(model, check_fn=is_block)
    ```

    ## Use instead
    ```python
    apply_activation_checkpointing(model, check_fn=is_block)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    ```

    ## Fix safety
    No automatic fix: reordering these calls changes the module structure.

    ## Versions
    torch >= 2.4.

    ## References
    - torchtitan `models/llama3/infra/parallelize.py` (AC → compile → FSDP)
    - accelerate `accelerator.py` (`_prepare_fsdp2`: "Needs to be done first, to make sure AC + fully_shard
      will work as expected"); transformers#30228
    - pytorch `FullyShardedDataParallel` docstring (`use_orig_params`: "True is required to use torch.compile()")
    """
    references = ("transformers#30228",)

    VALID = [
        """
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        from torch.distributed.fsdp import fully_shard
        import torch
        for i, block in enumerate(model.layers):
            block = checkpoint_wrapper(block)
            block = torch.compile(block)
            model.layers.register_module(str(i), block)
        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
        """,
        """
        from functools import partial
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing, checkpoint_wrapper, CheckpointImpl,
        )
        model = FSDP(model, auto_wrap_policy=policy)
        apply_activation_checkpointing(
            model,
            checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: isinstance(m, Block),
        )
        """,
        """
        import torch
        import torch.distributed.fsdp as fsdp
        model = fsdp.FullyShardedDataParallel(model, use_orig_params=True)
        model = torch.compile(model)
        """,
        # FSDP2 + whole-model compile after sharding is supported.
        """
        import torch
        from torch.distributed.fsdp import fully_shard
        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
        model = torch.compile(model)
        """,
    ]
    INVALID = [
        Invalid(
            """
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
            from torch.distributed.fsdp import fully_shard
            for block in model.layers:
                fully_shard(block)
            fully_shard(model)
            apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
            """,
            line=6,
        ),
        Invalid(
            """
            from torch.distributed.algorithms._checkpoint import checkpoint_wrapper as cw
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            def setup(model, policy):
                cw.apply_activation_checkpointing(model, check_fn=is_block)
                return FSDP(model, auto_wrap_policy=policy, use_orig_params=True)

            model = setup(model, policy)
            """,
            line=5,
        ),
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel
            model = FullyShardedDataParallel(model, auto_wrap_policy=policy)
            model = torch.compile(model)
            """,
            line=4,
        ),
        Invalid(
            """
            import torch as th
            import torch.distributed.fsdp as f
            from torch.distributed._composable import checkpoint

            def parallelize(model):
                for block in model.layers:
                    f.fully_shard(block)
                    checkpoint(block)
                f.fully_shard(model)
            """,
            line=8,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        for t in a.timelines:
            for ac in t.of("ac"):
                if ac.entity is None:
                    continue
                shards = t.before(ac, ("shard2",))
                if shards:
                    ctx.report(ac.node, self.message_ac_after_shard.format(line=ctx.line(shards[-1].node)))
                    continue
                if not t.before(ac, ("wrap1",)):
                    wraps = t.after(ac, ("wrap1",))
                    if wraps:
                        ctx.report(ac.node, self.message_ac_before_wrap1.format(line=ctx.line(wraps[0].node)))
            for comp in t.of("compile"):
                if comp.entity is None:
                    continue
                for w in t.before(comp, ("wrap1",)) + t.after(comp, ("wrap1",)):
                    if w.ref and w.ref.child:
                        continue
                    uop = w.call.kw("use_orig_params") if w.call else None
                    if w.call is None or w.call.star_kwargs() or (uop is not None and a.value(uop, w.call.scope) is not False):
                        continue
                    ctx.report(comp.node, self.message_compile_fsdp1.format(line=ctx.line(w.node)))
                    break
