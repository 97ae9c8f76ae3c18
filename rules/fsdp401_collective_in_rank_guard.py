from fsdplint import behaviour
from fsdplint.analysis import UNKNOWN
from fsdplint.findings import Severity
from fsdplint.rule import IN_FSDP_JOB, Invalid, Rule, Valid
from fsdplint.rules._wrapped import fsdp1_one_unit, saves_no_weights, unwrapped_receiver

_ACCELERATE = {"accelerator.get_state_dict", "accelerator.save_state", "accelerator.save_model"}


class CollectiveInRankGuard(Rule):
    code = "FSDP401"
    name = "collective-in-rank-guard"
    severity = Severity.ERROR
    sides = "SR"
    summary = (
        "state_dict gathering (`state_dict()`, `get_peft_model_state_dict`, `save_state`, FSDP1 FULL_STATE_DICT) "
        "or an explicit collective (`dist.all_reduce`, `dist.barrier`, `DTensor.full_tensor()`) called on rank 0 "
        "only: hangs"
    )
    versions = {"torch": ">=2.0"}
    doc = """
    ## What it does
    Finds state-dict gathering on a sharded model inside a rank guard (`if rank == 0:`,
    `if dist.get_rank() == 0:`, `if accelerator.is_main_process:`, `if trainer.is_world_process_zero():`,
    `@rank_zero_only`): `model.state_dict()`, `get_peft_model_state_dict(model)` and `save_pretrained()`
    without `state_dict=` on an FSDP1 model; `get_model_state_dict(..., full_state_dict=True)`;
    `accelerator.get_state_dict` / `save_state` / `save_model` and `trainer.save_model()` under an FSDP launch.
    Also explicit collectives on such a path — `torch.distributed` collectives (`all_reduce`, `barrier`,
    `broadcast`, `all_gather_object`, ...) without their own `group=`, and `DTensor.full_tensor()` — in this
    file or in a project helper the guarded code calls. Not reported: the same gathering or collective in the
    guard's other branch, or (explicit collectives) the same collective under another rank test of the same
    program (`if local_rank not in (-1, 0): dist.barrier()` before rank 0's download and `if local_rank == 0:
    dist.barrier()` after it), since every rank then joins one of them.
    A model wrapped elsewhere (by accelerate or the Trainer) counts as FSDP1 inside its own
    `FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, ...)` context; code in a branch that runs only
    under FSDP (`if trainer.is_fsdp_enabled:`, `if accelerator.distributed_type == DistributedType.FSDP:`)
    counts as FSDP, and code in a branch that runs only without it is left alone.

    Under `fsdplint run`, the collectives each simulated rank enters (torch.distributed's Python API) are
    logged; when rank 0 and the last rank reached the same stop point and one entered more of a collective
    than the other, that collective is reported at the job's line that entered it. With `--until save` the
    run goes on to the job's first save: a rank that stopped at its save and entered more of a collective than
    a rank that ran to the job's end (rank 0 gathering a state dict under its rank guard) is reported the same way.

    ## Why is this bad?
    Gathering a sharded state dict is a collective: every rank must take part in the all-gathers. When
    only rank 0 calls it, rank 0 waits forever for the others, and the job dies with an NCCL timeout
    (or hangs) at the first checkpoint, often hours into training. `DTensor.full_tensor()` is
    `redistribute(placements=[Replicate()]...)`, an all-gather over the tensor's mesh (torch 2.13
    torch/distributed/tensor/_api.py), so gathering FSDP2 parameters or optimizer moments on rank 0 alone
    hangs the same way (bergson#376).

    ## Example
    ```python
    if dist.get_rank() == 0:
        model.save_pretrained(output_dir)  # FSDP1 model: state_dict() all-gathers
    ```

    ## Use instead
    ```python
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        sd = model.state_dict()                  # all ranks gather
    if dist.get_rank() == 0:
        model.save_pretrained(output_dir, state_dict=sd)  # rank 0 writes
    ```
    With accelerate: `state_dict = accelerator.get_state_dict(model)` on every rank, then
    `unwrapped.save_pretrained(out, is_main_process=accelerator.is_main_process, state_dict=state_dict)`.

    ## Fix safety
    No automatic fix: the gather has to move out of the guard and its result has to reach the save.

    ## Versions
    All torch versions with FSDP; torch >= 2.3 for `torch.distributed.checkpoint.state_dict`.

    ## References
    - pytorch#122903, pytorch#143536; accelerate#2000; bergson#376 (optimizer moments gathered with
      `full_tensor()` in a helper called on rank 0 only)
    - accelerate docs (usage_guides/fsdp.md: saving); peft docs accelerate/fsdp.md
    """
    references = ("pytorch#122903", "pytorch#143536", "accelerate#2000")

    VALID = [
        # Rank-0-first as a context manager: one helper's barrier runs under `if not leader:` before the
        # body and under `if leader:` after it, so every rank reaches one barrier, then the other.
        Valid(
            """
            import contextlib
            import torch.distributed as dist

            def sync():
                if dist.is_initialized():
                    dist.barrier()

            @contextlib.contextmanager
            def leader_first(leader):
                if not leader:
                    sync()
                yield
                if leader:
                    sync()
            """,
            options=IN_FSDP_JOB,
        ),
        # After training under an FSDP1 launch, rank 0 loads the base and adapter again and merges: that copy
        # was never sharded, so saving it alone gathers nothing (FSDP403 speaks of the others waiting).
        Valid(
            """
            from peft import AutoPeftModelForCausalLM
            from transformers import AutoModelForCausalLM, Trainer

            model = AutoModelForCausalLM.from_pretrained("m")
            trainer = Trainer(model=model, args=training_args, peft_config=peft_config)
            trainer.train()
            trainer.save_model()
            if trainer.accelerator.is_main_process:
                model = AutoPeftModelForCausalLM.from_pretrained(training_args.output_dir)
                model = model.merge_and_unload()
                model.save_pretrained("merged")
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"},
        ),
        # All ranks gather, rank 0 writes.
        """
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType, FullStateDictConfig
        model = FSDP(model, auto_wrap_policy=policy)
        cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
            sd = model.state_dict()
        if dist.get_rank() == 0:
            model.save_pretrained("out", state_dict=sd)
        """,
        # is_main_process= instead of a guard: every rank runs save_pretrained.
        """
        from accelerate import Accelerator
        accelerator = Accelerator()
        model, opt = accelerator.prepare(model, opt)
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(
            "out",
            is_main_process=accelerator.is_main_process,
            save_function=accelerator.save,
            state_dict=accelerator.get_state_dict(model),
        )
        """,
        # Not sharded: a rank-0 save of a plain (or DDP) model is the usual pattern.
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model)
        if rank == 0:
            torch.save(model.module.state_dict(), "model.pt")
            model.module.save_pretrained("out")
        """,
        # accelerate's FSDP1 with no auto-wrap policy: the unwrapped model holds no FSDP unit, so its
        # state_dict() gathers nothing (it reads this rank's shard: FSDP402's finding).
        Valid(
            """
            import torch
            from accelerate import Accelerator
            from transformers import AutoModelForCausalLM
            accelerator = Accelerator()
            net = AutoModelForCausalLM.from_pretrained(name)
            net, opt = accelerator.prepare(net, opt)
            if accelerator.is_main_process:
                torch.save(accelerator.unwrap_model(net).state_dict(), "weights.pt")
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"},
        ),
        # FSDP2 state_dict() is local: no collective (FSDP402 checks what is saved).
        """
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions
        from torch.distributed.fsdp import fully_shard
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() == 0:
            torch.save(sd, "model.pt")
        """,
        # accelerate without FSDP: get_state_dict gathers nothing.
        """
        from accelerate import Accelerator
        accelerator = Accelerator()
        model = accelerator.prepare(model)
        if accelerator.is_main_process:
            accelerator.save_model(model, "out")
        """,
    ]
    VALID += [
        # Saving the config or the tokenizer under a rank guard gathers nothing.
        """
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained("org/model")
        tokenizer = AutoTokenizer.from_pretrained("org/model")
        model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
        train(model)
        if dist.get_rank() == 0:
            model.config.save_pretrained("out")
            tokenizer.save_pretrained("out")
            model.generation_config.save_pretrained("out")
        """,
        # Both branches of the rank test gather the same way: every rank joins the collective.
        """
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def checkpoint(net, path):
            dcp.save({"model": get_model_state_dict(net)}, checkpoint_id=path)

        model = FSDP(model, auto_wrap_policy=policy)
        leader = dist.get_rank() == 0
        if leader:
            with tracker.paused():
                checkpoint(model, "ckpt")
        else:
            checkpoint(model, "ckpt")
        """,
        # The helper shards only when asked; this call site says no, so the model saved on rank 0 is plain.
        """
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def build(cfg, shard=True):
            model = load(cfg)
            if cfg.fsdp and shard:
                model = FSDP(model, auto_wrap_policy=policy)
            return model

        model = build(cfg, shard=False)
        if dist.get_rank() == 0:
            model.save_pretrained("out")
        """,
    ]
    VALID += [
        # Every rank gathers the sharded tensors; only rank 0 writes.
        Valid(
            """
            import torch
            import torch.distributed as dist

            def export(moments, path):
                full = {k: v.full_tensor().cpu() for k, v in moments.items()}
                if dist.get_rank() == 0:
                    torch.save(full, path)

            export(opt_moments, "moments.pt")
            """,
            options=IN_FSDP_JOB,
        ),
        # Rank 0 downloads first while the others wait; then rank 0 releases them.
        Valid(
            """
            import torch.distributed as dist
            if dist.get_rank() != 0:
                dist.barrier()
            fetch_dataset()
            if dist.get_rank() == 0:
                dist.barrier()
            """,
            options=IN_FSDP_JOB,
        ),
        # The same as a context manager, with a rank test that is not spelled "rank 0".
        Valid(
            """
            import contextlib
            import torch

            @contextlib.contextmanager
            def local_leader_first(local_rank):
                if local_rank not in (-1, 0):
                    torch.distributed.barrier()
                yield
                if local_rank == 0:
                    torch.distributed.barrier()
            """,
            options=IN_FSDP_JOB,
        ),
        # A collective over a group of the script's own (it may hold just the guarded ranks).
        Valid(
            """
            import torch.distributed as dist
            if dist.get_rank() == 0:
                dist.all_reduce(stats, group=leaders)
            """,
            options=IN_FSDP_JOB,
        ),
    ]
    VALID += [
        # FSDP1 context on a model accelerate prepared: every rank gathers, the main process writes.
        """
        import torch
        from accelerate import Accelerator
        from peft import get_peft_model_state_dict
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType, FullStateDictConfig

        class Runner:
            def __init__(self, net, opt):
                self.accelerator = Accelerator()
                self.net, self.opt = self.accelerator.prepare(net, opt)

            def export_adapter(self, path):
                inner = self.accelerator.unwrap_model(self.net)
                cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
                with FSDP.state_dict_type(inner, StateDictType.FULL_STATE_DICT, cfg):
                    weights = get_peft_model_state_dict(inner)
                if self.accelerator.is_main_process:
                    torch.save(weights, path)
        """,
    ]
    VALID += [
        # The early return comes after the gather: every rank gathers, rank 0 alone writes.
        """
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType, FullStateDictConfig

        def dump(model, path):
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
                sd = model.state_dict()
            if dist.get_rank() != 0:
                return
            torch.save(sd, path)

        def main(net, policy):
            model = FSDP(net, auto_wrap_policy=policy)
            dump(model, "full.pt")
        """,
        # A method guard that is not about ranks.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        class Job:
            def __init__(self, net, policy):
                self.net = FSDP(net, auto_wrap_policy=policy)

            def due(self):
                return self.step % self.every == 0

            def finish(self, out):
                if self.due():
                    self.net.save_pretrained(out)
        """,
        # The rank-0 save runs only when FSDP is off; under FSDP every rank saves.
        Valid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, opt = accelerator.prepare(model, opt)
            if accelerator.distributed_type != DistributedType.FSDP:
                if accelerator.is_main_process:
                    accelerator.save_state("ckpt")
            else:
                accelerator.save_state("ckpt")
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"},
        ),
    ]
    INVALID = [
        # A project helper gathers DTensor shards with full_tensor(), and it is called on rank 0 only.
        Invalid(
            """
            import torch
            import torch.distributed as dist

            def export(moments, path):
                full = {}
                for k, v in moments.items():
                    full[k] = v.full_tensor().cpu()
                torch.save(full, path)

            if dist.get_rank() == 0:
                export(opt_moments, "moments.pt")
            """,
            line=7,
            options=IN_FSDP_JOB,
        ),
        # An all-reduce of metrics inside the logging branch of rank 0.
        Invalid(
            """
            import torch.distributed as dist
            if dist.get_rank() == 0:
                dist.all_reduce(loss_sum)
                print(loss_sum.item())
            """,
            line=3,
            options=IN_FSDP_JOB,
        ),
        # Only the branch of rank 0 gathers; the other ranks do something else.
        Invalid(
            """
            import torch.distributed as dist
            from torch.distributed.checkpoint.state_dict import get_model_state_dict
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, auto_wrap_policy=policy)
            if dist.get_rank() == 0:
                torch.save(get_model_state_dict(model), "model.pt")
            else:
                log("waiting")
            """,
            line=6,
        ),
        # An early return on the other ranks guards the rest of the function.
        Invalid(
            """
            import torch
            import torch.distributed as dist
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            def dump(model, path):
                if dist.get_rank() != 0:
                    return
                torch.save(model.state_dict(), path)

            def main(net, policy):
                model = FSDP(net, auto_wrap_policy=policy)
                dump(model, "full.pt")
            """,
            line=8,
        ),
        # The guard is a method whose body is the rank test.
        Invalid(
            """
            import torch.distributed as dist
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            class Job:
                def __init__(self, net, policy):
                    self.net = FSDP(net, auto_wrap_policy=policy)

                def writes_files(self):
                    return dist.get_rank() == 0

                def finish(self, out):
                    if self.writes_files():
                        self.net.save_pretrained(out)
            """,
            line=13,
        ),
        # `is_main` comes from a base class defined elsewhere: the name says what it guards.
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from .base import BaseRunner

            class Runner(BaseRunner):
                def __init__(self, net, policy):
                    self.net = FSDP(net, auto_wrap_policy=policy)

                def checkpoint(self, path):
                    if self.is_main:
                        torch.save(self.net.state_dict(), path)
            """,
            line=11,
        ),
        # No launch config, but the branch itself runs only under FSDP.
        Invalid(
            """
            from accelerate import Accelerator
            from accelerate.utils import DistributedType
            accelerator = Accelerator()
            model, opt = accelerator.prepare(model, opt)
            if accelerator.distributed_type == DistributedType.FSDP:
                if accelerator.is_main_process:
                    weights = accelerator.get_state_dict(model)
            """,
            line=7,
        ),
        # The trainer's own `is_main` property guards a helper method that gathers inside FSDP1's
        # FULL_STATE_DICT context (the model was wrapped by accelerate.prepare, not in this file).
        Invalid(
            """
            import torch
            from accelerate import Accelerator
            from peft import get_peft_model_state_dict
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType, FullStateDictConfig

            class Runner:
                def __init__(self, net, opt):
                    self.accelerator = Accelerator()
                    self.net, self.opt = self.accelerator.prepare(net, opt)

                @property
                def is_main(self):
                    return self.accelerator.is_main_process

                def _export_adapter(self, path):
                    inner = self.accelerator.unwrap_model(self.net) if self.accelerator else self.net
                    ctx = FSDP.state_dict_type(inner, StateDictType.FULL_STATE_DICT,
                                               FullStateDictConfig(offload_to_cpu=True, rank0_only=True))
                    with torch.no_grad(), ctx:
                        weights = get_peft_model_state_dict(inner)
                    torch.save(weights, path)

                def checkpoint(self, step):
                    if self.is_main:
                        self._export_adapter(f"adapter-{step}.pt")
            """,
            line=20,
        ),
        # TrainingArguments built from a `**kwargs` dict filled key by key: FSDP is on all the same.
        Invalid(
            """
            from transformers import Trainer, TrainingArguments

            def run(model, data, distributed, rank):
                extra = {}
                if distributed:
                    extra["fsdp"] = "full_shard auto_wrap"
                    extra["fsdp_config"] = {"use_orig_params": True}
                args = TrainingArguments(output_dir="out", bf16=True, **extra)
                trainer = Trainer(model=model, args=args, train_dataset=data)
                trainer.train()
                if rank == 0:
                    trainer.save_model()
            """,
            line=12,
        ),
        Invalid(
            """
            import torch.distributed as dist
            from torch.distributed.fsdp import fully_shard
            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model)
            train(model)
            if dist.get_rank() == 0:
                model.save_pretrained("out")
            """,
            target={"transformers": "4.57.1"},
            line=8,
        ),
        Invalid(
            """
            import torch.distributed as dist
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
            if dist.get_rank() == 0:
                model.save_pretrained("out")
            """,
            line=5,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as fsdp
            from peft import get_peft_model_state_dict as lora_sd

            def save(model, path):
                sd = lora_sd(model)
                torch.save(sd, path)

            def main(rank):
                model = fsdp.FullyShardedDataParallel(model, auto_wrap_policy=policy)
                if rank == 0:
                    save(model, "adapter.pt")
            """,
            line=5,
        ),
        Invalid(
            """
            import torch.distributed as dist
            from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions
            from torch.distributed.fsdp import fully_shard
            for layer in model.layers:
                fully_shard(layer)
            fully_shard(model)
            if dist.get_rank() == 0:
                sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
            """,
            line=8,
        ),
        Invalid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, optimizer = accelerator.prepare(model, optimizer)
            if accelerator.is_main_process:
                accelerator.save_state("ckpt")
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"},
            line=5,
        ),
        Invalid(
            """
            from transformers import Trainer, TrainingArguments
            args = TrainingArguments("out", fsdp="full_shard auto_wrap")
            trainer = Trainer(model=model, args=args)
            trainer.train()
            if trainer.is_world_process_zero():
                trainer.save_model()
            """,
            line=6,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        launch = getattr(a, "launch_fsdp_version", None)
        reported: set = set()
        for t in a.timelines:
            for ev in t.events:
                if ev.kind not in ("state_dict", "save") or (ev.kind == "save" and saves_no_weights(a, ev)):
                    continue  # (a config's or tokenizer's save_pretrained writes a small file: no collective)
                guard = a.rank_guard(ev.step)
                if guard is None or _both_branches(a, t, ev, guard) or a.fsdp_branch(ev.step) is False:
                    continue  # (the other branch gathers too, or this branch runs only without FSDP)
                what = _collective(a, t, ev, launch)
                rests_on = ()
                if what is None:
                    what, rests_on = _gathering_save(ctx, a, t, ev, launch), ("save_pretrained_gathers_dtensors",)
                if what is None:
                    continue
                reported.add(id(ev.step))
                ctx.report(
                    ev,  # from another module: at the call in this file that ran it under this guard
                    f"{what} is a collective on a sharded model (every rank must join its gathers), but it runs only "
                    f"on some ranks (guard at line {ctx.line(guard)}): rank 0 waits for the others forever and the "
                    "job hangs until the NCCL timeout. Gather on all ranks outside the guard, then let rank 0 "
                    "write (pass the gathered dict as save_pretrained(..., state_dict=sd)).",
                    rests_on=rests_on,
                )
        self._explicit(ctx, a, reported)

    def _explicit(self, ctx, a, reported: set) -> None:
        """Explicit collectives (`dist.all_reduce`, `dist.barrier`, `DTensor.full_tensor()`) on a path that
        only some ranks take, in this file or in a helper of the project it calls."""
        seen: set = set()
        for t in a.timelines:
            for step in t.steps:
                call = step.call
                label = _explicit_collective(call) if call is not None else None
                if label is None or id(step) in reported:
                    continue
                guard = a.rank_guard(step)
                if guard is None or (id(call.node), id(guard)) in seen or _reached_by_all(a, t, step, guard, label):
                    continue
                seen.add((id(call.node), id(guard)))
                ctx.report(
                    step.site.node if step.origin is not None and step.site is not None else call.node,
                    f"{label} is a collective (every rank of the group must call it), but it runs only on some ranks "
                    f"(guard at line {ctx.line(guard)}){_via(ctx, step)}: the ranks that call it wait for the others "
                    "forever and the job hangs until the NCCL timeout. Call it on every rank, outside the guard (keep "
                    "only the writing under it).",
                    related=(call.node,) if step.origin is not None else (),
                )


# torch.distributed collectives (torch 2.13 distributed_c10d.py): every rank of the group must call them.
_TORCH_COLLECTIVES = frozenset({
    "barrier", "monitored_barrier", "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
    "broadcast", "broadcast_object_list", "reduce", "gather", "gather_object", "scatter", "scatter_object_list",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
})


def _explicit_collective(call):
    """A label for an explicit collective call, else None. A call given its own `group=` may run over a
    group of just the guarded ranks: not judged."""
    if call.method == "full_tensor" and call.receiver is not None and not call.node.args:
        return "DTensor.full_tensor() (an all-gather over the mesh)"
    q = call.qualname or ""
    if q.startswith("torch.distributed.") and q.rsplit(".", 1)[-1] in _TORCH_COLLECTIVES and q.count(".") <= 3:
        if call.kw("group") is not None or call.kw("process_group") is not None:
            return None
        return f"{q.rsplit('.', 1)[-1]}()"
    return None


def _via(ctx, step) -> str:
    if step.origin is None:
        return ""
    return f", reached through {step.site.func or 'a call'}() at line {ctx.line(step.site.node)}" \
        if step.site is not None else ""


def _reached_by_all(a, t, step, guard, label) -> bool:
    """The same collective also runs on the ranks this guard leaves out: in the other branch of the same
    `if`, or under another rank test of the same program (`if local_rank not in (-1, 0): dist.barrier()` ...
    `if local_rank == 0: dist.barrier()`, the rank-0-first pattern). Which ranks each test selects is not
    worked out: two guarded calls of one collective are taken to pair up."""
    mine = _branch(a, step, guard)
    for other in t.steps:
        c = other.call
        if other is step or c is None or _explicit_collective(c) != label:
            continue
        # (the same call inlined at another call site counts: one helper's barrier under `if not is_main:`
        # and under `if is_main:` pairs up, the context-manager form of rank-0-first)
        g = a.rank_guard(other)
        if g is None:
            continue
        if g is not guard or (mine in ("body", "orelse") and _branch(a, other, g) not in (None, mine)):
            return True
    return False


def _branch(a, step, guard):
    """Which branch of the rank guard `guard` ("body"/"orelse") this step runs in, through its call sites."""
    for c in a.site_calls(step):
        for g in c.guards:
            if g.node is guard:
                return g.branch
    return None


def _both_branches(a, t, ev, guard) -> bool:
    """`if rank == 0: save(model, ...) else: save(model)`: the other ranks run the same gathering in the
    guard's other branch, so every rank joins the collective (each branch's call is reached by its ranks)."""
    mine = _branch(a, ev.step, guard)
    if mine not in ("body", "orelse"):
        return False
    api = ev.data.get("api")
    for other in t.events:
        if other is ev or other.kind != ev.kind or other.data.get("api") != api:
            continue
        if ev.entity is not None and other.entity is not None and t.find(other.entity) != t.find(ev.entity):
            continue
        b = _branch(a, other.step, guard)
        if b in ("body", "orelse") and b != mine:
            return True
    return False


def _collective(a, t, ev, launch):
    """A label for the gathering call if it is a collective here, else None."""
    call = ev.call
    if call is None:
        return None
    api = ev.data.get("api")
    if api in _ACCELERATE or api == "trainer.save_model":
        # FSDP from the launch, or in a branch that runs only when it is on (`if trainer.is_fsdp_enabled:`).
        return f"{api}()" if launch is not None or a.fsdp_branch(ev.step) else None
    if ev.kind == "save" and a.keyword(call, "state_dict") is not None:
        return None  # saves a dict gathered elsewhere
    state = t.wrap_state(ev.entity, ev.seq, at=ev) if ev.entity else None
    if api == "get_model_state_dict":
        if state == "fsdp1":
            return "get_model_state_dict()"
        opts = a.keyword(call, "options")
        if opts is None or opts is UNKNOWN:
            return None
        built = _options_call(a, opts, call)
        if built is not None and a.value(a.keyword(built, "full_state_dict") or None, call.scope) is True:
            return "get_model_state_dict(full_state_dict=True)"
        return None
    if ev.kind == "state_dict" and api is None and fsdp1_one_unit(a, t, ev) and unwrapped_receiver(
            a, call.receiver, call.scope):
        return None  # the inner module of a one-unit FSDP1 root holds no FSDP unit: no gather (FSDP402's shard)
    label = {"save": "save_pretrained()", "state_dict": "state_dict()"}[ev.kind]
    if api == "get_peft_model_state_dict":
        label = "get_peft_model_state_dict()"
    if state == "fsdp1":
        if ev.kind == "save" and not _auto_wrapped(a, t, ev):
            return None  # without nested units the inner module's state_dict() gathers nothing
        return label
    if state is None and launch == 1 and _launch_wrapped(a, t, ev):
        return label
    if state is None and ev.entity and a.full_state_dict_context(ev.step, ev.entity, t) is not None:
        # Wrapped elsewhere (accelerate, the Trainer), but the code itself says FSDP1: the gather of the
        # FULL_STATE_DICT context it runs in.
        return f"{label} inside FSDP.state_dict_type(FULL_STATE_DICT)"
    return None


def _gathering_save(ctx, a, t, ev, launch):
    """save_pretrained on an FSDP2 model with a transformers that all-gathers each DTensor while writing."""
    if ev.kind != "save" or ev.call is None or a.keyword(ev.call, "state_dict") is not None:
        return None
    state = t.wrap_state(ev.entity, ev.seq, at=ev) if ev.entity else None
    if state != "fsdp2" and not (state is None and launch == 2 and t.before(ev, ("prepare",))):
        return None
    tv = ctx.version("transformers")
    if not behaviour.holds("save_pretrained_gathers_dtensors", tv):
        return None
    return f"save_pretrained() on an FSDP2 model ({tv.describe()} gathers each DTensor with full_tensor())"


def _options_call(a, expr, call):
    import libcst as cst

    from fsdplint.resolve import dotted

    for _ in range(4):
        if isinstance(expr, cst.Call):
            return a.call_at(expr)
        d = dotted(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
        expr = a.binding(d, call.scope) if d else None
    return None


def _auto_wrapped(a, t, ev) -> bool:
    """Was the FSDP1 wrap given an auto-wrap policy (nested units), or can we not tell?"""
    for w in t.before(ev, ("wrap1",)):
        c = w.call
        if c is None or w.ref is None or w.ref.child:
            continue
        if a.keyword(c, "auto_wrap_policy") is not None:
            return True
        if c.star_kwargs():
            return True
    return not any(w.ref is not None and not w.ref.child for w in t.before(ev, ("wrap1",)))


def _launch_wrapped(a, t, ev) -> bool:
    """Did accelerate or the Trainer wrap this model (FSDP from the launch config)?"""
    if t.before(ev, ("prepare",)):
        return True
    ref = ev.ref
    if ref is not None and ref.key.split(":")[-1].startswith("trainer."):
        return True
    # The Trainer wraps the model it was given; a name bound afterwards to a freshly loaded model
    # (`model = AutoPeftModelForCausalLM.from_pretrained(out)` to merge) holds a plain, unsharded one.
    return any(t.is_model(ev.entity) and s.order < ev.seq and not t.rebound(ev.entity, s, ev)
               for s in t.steps if s.call is not None and s.call.api == "Trainer")
