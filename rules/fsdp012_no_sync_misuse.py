from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid


class NoSyncMisuse(Rule):
    code = "FSDP012"
    name = "no-sync-misuse"
    severity = Severity.ERROR
    sides = "S"
    versions = {"torch": ">=2.4"}
    summary = "`no_sync()` on an FSDP2 module (AttributeError) / memory blow-up on FSDP1."
    message = (
        "`{recv}.no_sync()` on a model sharded with {how} (line {line}): FSDP2 modules have no `no_sync` "
        "(AttributeError at the first accumulation step). Use `{recv}.set_requires_gradient_sync(False)` for the "
        "micro-batches that skip the reduce-scatter and `set_requires_gradient_sync(True)` before the last one, "
        "or `accelerator.no_sync(model)`, which does this for FSDP2."
    )
    doc = """
    ## What it does
    Finds `model.no_sync()` on a model sharded with FSDP2 (`fully_shard`, or `accelerator.prepare` under an
    accelerate config with `fsdp_version: 2`).

    ## Why is this bad?
    FSDP2's `FSDPModule` has no `no_sync()` context manager; gradient accumulation without reduce-scatter is
    `set_requires_gradient_sync(False)`. Code ported from DDP/FSDP1 fails with `AttributeError: ... object
    has no attribute 'no_sync'`. (On FSDP1, `no_sync()` exists but keeps *unsharded* gradients for the whole
    model until the synchronising step, which can exhaust memory on large models; FSDP2 keeps them sharded.)

    ## Example
    ```python
    fully_shard(model)
    with model.no_sync():
        loss.backward()
    ```

    ## Use instead
    ```python
    fully_shard(model)
    model.set_requires_gradient_sync(is_last_microbatch)
    loss.backward()
    ```

    ## Fix safety
    No automatic fix: the rewrite depends on how the accumulation loop decides the last micro-batch.

    ## Versions
    torch >= 2.4 (FSDP2).

    ## References
    - pytorch#118298; torchtitan docs/fsdp.md
    - accelerate#2531 (`Accelerator.no_sync` handles FSDP2); meta-pytorch/tnt#1057
    """
    references = ("pytorch#118298", "accelerate#2531", "meta-pytorch/tnt#1057")

    VALID = [
        """
        from torch.distributed.fsdp import fully_shard
        fully_shard(model)
        for step, batch in enumerate(loader):
            model.set_requires_gradient_sync(step % accum == accum - 1)
            model(**batch).loss.backward()
        """,
        # FSDP1 has no_sync.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model)
        with model.no_sync():
            model(**batch).loss.backward()
        """,
        # accelerate's no_sync handles FSDP2.
        Valid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, opt = accelerator.prepare(model, opt)
            with accelerator.no_sync(model):
                accelerator.backward(model(**batch).loss)
            """,
        ),
        # The same loop under an FSDP1 accelerate config: FSDP1 modules have no_sync.
        Valid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator(gradient_accumulation_steps=4)
            model, optimizer = accelerator.prepare(model, optimizer)
            for batch in loader:
                with model.no_sync():
                    accelerator.backward(model(**batch).loss)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"},
        ),
        # `getattr` with a default: an FSDP2 module has no `no_sync`, so the default context is used.
        """
        import contextlib
        from torch.distributed.fsdp import fully_shard
        fully_shard(model)
        with getattr(model, "no_sync", contextlib.nullcontext)():
            model(**batch).loss.backward()
        """,
        # DDP model in the same file as an FSDP2 model.
        """
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.distributed.fsdp import fully_shard
        fully_shard(big_model)
        small = DDP(small_model)
        with small.no_sync():
            small(x).sum().backward()
        """,
    ]
    INVALID = [
        # `getattr(model, "no_sync")()` is the method call itself.
        Invalid(
            """
            from torch.distributed.fsdp import fully_shard
            fully_shard(model)
            with getattr(model, "no_sync")():
                model(**batch).loss.backward()
            """,
            line=3,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import fully_shard
            for layer in model.layers:
                fully_shard(layer)
            fully_shard(model)
            with model.no_sync():
                model(**batch).loss.backward()
            """,
            line=5,
        ),
        Invalid(
            """
            import contextlib
            import torch.distributed._composable.fsdp as f2

            def train(model, loader, accum):
                f2.fully_shard(model)
                for i, batch in enumerate(loader):
                    ctx = model.no_sync() if i % accum else contextlib.nullcontext()
                    with ctx:
                        model(**batch).loss.backward()
            """,
            line=7,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import fully_shard as shard
            from peft import get_peft_model

            class Trainer:
                def setup(self):
                    self.model = get_peft_model(self.base, self.cfg)
                    shard(self.model)

                def step(self, batch):
                    with self.model.no_sync():
                        self.model(**batch).loss.backward()

                def run(self):
                    self.setup()
                    self.step(batch)
            """,
            line=10,
        ),
        Invalid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator(gradient_accumulation_steps=4)
            model, optimizer = accelerator.prepare(model, optimizer)
            for batch in loader:
                with model.no_sync():
                    accelerator.backward(model(**batch).loss)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"},
            line=5,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        for t in a.timelines:
            for ev in t.of("no_sync"):
                if ev.entity is None or (ev.ref and ev.ref.child):
                    continue
                how, wrap = None, None
                if t.wrap_state(ev.entity, ev.seq, at=ev) == "fsdp2":
                    how = "fully_shard"
                    wrap = next(e for e in t.before(ev, ("shard2",)))
                elif a.launch_fsdp_version == 2 and t.before(ev, ("prepare",)):
                    how = "accelerate (fsdp_version: 2)"
                    wrap = t.before(ev, ("prepare",))[0]
                if how is None:
                    continue
                recv = ctx.code(ev.call.receiver) if ev.call and ev.call.receiver is not None else "model"
                ctx.report(ev.node, self.message.format(recv=recv, how=how, line=ctx.line(wrap.node)))
