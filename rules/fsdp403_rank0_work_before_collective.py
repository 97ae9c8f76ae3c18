from fsdplint.findings import Severity
from fsdplint.rule import IN_FSDP_JOB, Invalid, Rule

# torch.distributed collectives a waiting rank can sit in.
_TORCH_COLLECTIVES = {
    "barrier", "monitored_barrier", "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "broadcast",
    "broadcast_object_list", "reduce", "gather", "gather_object", "scatter", "reduce_scatter",
    "reduce_scatter_tensor",
}
# accelerate / Trainer methods that synchronise every rank.
_SYNC_METHODS = {"wait_for_everyone", "gather", "gather_for_metrics", "reduce", "save_model", "get_state_dict",
                 "save_state"}
_INIT_KWARGS = ("accelerate.InitProcessGroupKwargs", "accelerate.utils.InitProcessGroupKwargs",
                "accelerate.utils.dataclasses.InitProcessGroupKwargs")

# Defaults read in torch 2.13 (c10d ProcessGroupNCCL.hpp kProcessGroupNCCLDefaultTimeout, ProcessGroup.hpp
# kProcessGroupDefaultTimeout, exposed as torch.distributed.constants.default_pg_nccl_timeout / default_pg_timeout),
# accelerate 1.15 (InitProcessGroupKwargs: 600 s for nccl, 1800 s otherwise) and transformers (ddp_timeout=1800).
NCCL_DEFAULT_S = 600
OTHER_DEFAULT_S = 1800
TRAINER_DEFAULT_S = 1800


class Rank0WorkBeforeCollective(Rule):
    code = "FSDP403"
    name = "rank0-work-before-collective"
    severity = Severity.WARNING
    sides = "S"
    summary = (
        "an adapter merged, or a model loaded and saved, on rank 0 only while the other ranks wait in the next "
        "collective under the default process-group timeout (10 min NCCL, 30 min under the Trainer)"
    )
    doc = """
    ## What it does
    Finds a rank guard (`if rank == 0:`, `if accelerator.is_main_process:`, `if
    trainer.is_world_process_zero():`, ...) that merges an adapter (`merge_and_unload()`,
    `merge_adapter()`) or loads a model (`from_pretrained`, `AutoPeftModelForCausalLM.from_pretrained`,
    `PeftModel.from_pretrained`) and saves it, followed — outside the guard, and not by wrapping or training
    — by a collective every rank joins (`dist.barrier()`, `accelerator.wait_for_everyone()`,
    `dist.all_reduce(...)`, `accelerator.gather`, `trainer.save_model()`, ...), in a script that never
    raises the process-group timeout. Loading on rank 0 alone before wrapping (for `sync_module_states` /
    `cpu_ram_efficient_loading`) is the recommended pattern and is not reported.

    ## Why is this bad?
    While rank 0 reads the base model, merges the adapter and writes the merged weights, the other ranks
    are already blocked in the next collective. The collective's timeout runs from the moment they enter
    it: torch 2.13 defaults to 10 minutes for NCCL (`default_pg_nccl_timeout`) and 30 minutes for gloo;
    accelerate's `InitProcessGroupKwargs` defaults to 600 s for NCCL; the HF Trainer sets
    `ddp_timeout=1800` s. Loading and saving a bf16 model moves 2 bytes per parameter each way: a 70B model
    is 140 GB read plus 140 GB written, about 9 minutes at a sustained 0.5 GB/s before the merge itself,
    and Mixtral-8x22B (141B) needs twice that. The job then dies with `Watchdog caught collective operation
    timeout ... Timeout(ms)=1800000` after training succeeded (transformers#31675).

    ## Example
    ```python
    trainer.train()
    if trainer.is_world_process_zero():
        model = AutoPeftModelForCausalLM.from_pretrained(out, torch_dtype=torch.bfloat16)
        model.merge_and_unload().save_pretrained(out, safe_serialization=True)
    trainer.accelerator.wait_for_everyone()
    ```

    ## Use instead
    Merge in a separate single-process step after the distributed job exits, or give the job a timeout that
    covers the work:
    ```python
    dist.init_process_group("nccl", timeout=datetime.timedelta(hours=2))
    # accelerate: Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(hours=2))])
    # Trainer: TrainingArguments(..., ddp_timeout=7200), or `ddp_timeout: 7200` in the recipe YAML the
    # launcher passes (`--config recipe.yaml`), or `--ddp_timeout 7200` on the command line
    ```
    Or do the work on every rank (each rank loads and merges, rank 0 alone writes with
    `save_pretrained(..., is_main_process=rank == 0)`), or drop the collective that follows.

    ## Fix safety
    No automatic fix: how long the work takes, and which remedy fits, depends on the model and the storage.

    ## Versions
    All versions. The defaults quoted are torch 2.13's and accelerate 1.15's.

    ## References
    - transformers#31675 (QLoRA + FSDP, Mixtral-8x22B: merge on the main process, the other ranks time out
      in an ALLREDUCE after 1800000 ms)
    - torch src torch/distributed/constants.py, distributed_c10d.py (`_get_default_timeout`)
    - accelerate src utils/dataclasses.py (`InitProcessGroupKwargs`); transformers docs (`ddp_timeout`)
    """
    references = ("transformers#31675",)

    VALID = [
        # The timeout covers the work.
        """
        import datetime
        import torch.distributed as dist
        from peft import AutoPeftModelForCausalLM
        dist.init_process_group("nccl", timeout=datetime.timedelta(hours=3))
        train()
        if dist.get_rank() == 0:
            merged = AutoPeftModelForCausalLM.from_pretrained("out").merge_and_unload()
            merged.save_pretrained("merged")
        dist.barrier()
        """,
        # accelerate: the timeout is raised through InitProcessGroupKwargs.
        """
        from datetime import timedelta
        from accelerate import Accelerator
        from accelerate.utils import InitProcessGroupKwargs
        from peft import AutoPeftModelForCausalLM
        accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(hours=2))])
        if accelerator.is_main_process:
            model = AutoPeftModelForCausalLM.from_pretrained("out")
            model.merge_and_unload().save_pretrained("merged")
        accelerator.wait_for_everyone()
        """,
        # Nothing waits for rank 0: the other ranks just exit.
        """
        import torch.distributed as dist
        from peft import AutoPeftModelForCausalLM
        dist.init_process_group("nccl")
        train()
        dist.barrier()
        if dist.get_rank() == 0:
            AutoPeftModelForCausalLM.from_pretrained("out").merge_and_unload().save_pretrained("merged")
        """,
        # The barrier has its own timeout.
        """
        import torch.distributed as dist
        from peft import AutoPeftModelForCausalLM
        if dist.get_rank() == 0:
            AutoPeftModelForCausalLM.from_pretrained("out").merge_and_unload().save_pretrained("merged")
        dist.monitored_barrier(timeout=BARRIER_TIMEOUT, wait_all_ranks=True)
        dist.all_reduce(flag)
        """,
        # Every rank loads and merges; rank 0 only writes.
        """
        import torch.distributed as dist
        from peft import AutoPeftModelForCausalLM
        dist.init_process_group("nccl")
        merged = AutoPeftModelForCausalLM.from_pretrained("out").merge_and_unload()
        merged.save_pretrained("merged", is_main_process=dist.get_rank() == 0)
        dist.barrier()
        """,
        # Rank-0 loading for sync_module_states: the next collectives are FSDP's own.
        """
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from transformers import AutoModelForCausalLM
        dist.init_process_group("nccl")
        if dist.get_rank() == 0:
            model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-13b-hf")
        else:
            model = build_on_meta()
        model = FSDP(model, sync_module_states=True, device_id=local_rank)
        train(model)
        dist.barrier()
        """,
        # Trainer with ddp_timeout raised.
        """
        from transformers import Trainer, TrainingArguments, AutoModelForCausalLM
        args = TrainingArguments("out", fsdp="full_shard", ddp_timeout=10800)
        trainer = Trainer(model=model, args=args)
        trainer.train()
        if trainer.is_world_process_zero():
            base = AutoModelForCausalLM.from_pretrained("base")
        trainer.accelerator.wait_for_everyone()
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from peft import AutoPeftModelForCausalLM
            from transformers import Trainer
            trainer = Trainer(model=model, args=args, train_dataset=ds)
            trainer.train()
            if trainer.is_world_process_zero():
                model = AutoPeftModelForCausalLM.from_pretrained("out", torch_dtype=torch.bfloat16)
                model = model.merge_and_unload()
                model.save_pretrained("out", safe_serialization=True)
            trainer.accelerator.wait_for_everyone()
            """,
            line=7,
            options=IN_FSDP_JOB,
        ),
        Invalid(
            """
            import torch.distributed as d
            from peft import PeftModel
            from transformers import AutoModelForCausalLM as Auto

            def merge(path):
                base = Auto.from_pretrained("meta-llama/Llama-3.1-70B")
                return PeftModel.from_pretrained(base, path).merge_and_unload()

            def main():
                d.init_process_group("nccl")
                if d.get_rank() == 0:
                    merge("adapter").save_pretrained("merged")
                d.barrier()
            """,
            line=6,
            options=IN_FSDP_JOB,
        ),
        Invalid(
            """
            from accelerate import Accelerator
            from peft import AutoPeftModelForCausalLM
            accelerator = Accelerator()
            if accelerator.is_main_process:
                merged = AutoPeftModelForCausalLM.from_pretrained("out").merge_and_unload()
                merged.save_pretrained("merged")
            accelerator.wait_for_everyone()
            """,
            line=5,
            options=IN_FSDP_JOB,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        if _timeout_raised(a):
            return
        seen: set = set()
        for t in a.timelines:
            for step in t.steps:
                call = step.call
                if call is None or not _heavy(call):
                    continue
                guard = a.rank_guard(step)
                if guard is None or id(guard) in seen:
                    continue
                if call.method not in ("merge_and_unload", "merge_adapter") and not _saves_under(a, t, guard):
                    continue  # rank-0 loading for sync_module_states / cpu_ram_efficient_loading: the usual pattern
                coll = _next_collective(a, t, step)
                if coll is None or a.keyword(coll, "timeout") is not None:
                    continue  # none, or one with its own timeout (`monitored_barrier(timeout=...)`)
                seen.add(id(guard))
                limit = _default_timeout(a)
                ctx.report(
                    call.node,
                    f"This merges, or loads and saves, a model on some ranks only (guard at line {ctx.line(guard)}) while the "
                    f"other ranks already wait in {ctx.code(coll.node.func)}() (line {ctx.line(coll.node)}). Their "
                    f"wait is bounded by the process-group timeout, here the default {limit}; reading and "
                    "writing a bf16 model moves 2 bytes per parameter each way (a 70B model: 140 GB + 140 GB, ~9 min "
                    "at 0.5 GB/s before the merge), so the job can die with a watchdog timeout after training "
                    "succeeded (transformers#31675). Raise the timeout (init_process_group(timeout=...), "
                    "InitProcessGroupKwargs(timeout=...), TrainingArguments(ddp_timeout=...)), merge in a separate "
                    "process after the job, or do the work on every rank.",
                )


def _heavy(call) -> bool:
    return call.api in ("load_model", "PeftModel_from_pretrained") or call.method in ("merge_and_unload", "merge_adapter")


def _is_collective(a, call) -> bool:
    q = call.qualname or ""
    if q.startswith("torch.distributed.") and q.rsplit(".", 1)[-1] in _TORCH_COLLECTIVES:
        return True
    if call.method in _SYNC_METHODS and call.receiver is not None:
        d = a.code(call.receiver)
        if call.method == "save_model":
            return "trainer" in d.lower() and a.launch_fsdp_version is not None
        return "accelerator" in d.lower() or "state" in d.lower()
    return False


def _saves_under(a, t, guard) -> bool:
    """The guarded block also writes a model (the reload-merge-save of transformers#31675)."""
    for step in t.steps:
        call = step.call
        if call is not None and a.rank_guard(step) is guard and (
                call.method == "save_pretrained" or call.api == "torch_save"):
            return True
    return False


def _next_collective(a, t, heavy_step):
    """The first collective after the guarded work, outside any rank guard, on a path that can follow it.
    Work that comes before wrapping or training is met by FSDP's own collectives (sync_module_states), which
    the linter does not time: stay silent there."""
    for step in t.steps[heavy_step.order + 1:]:
        call = step.call
        if call is None:
            continue
        if call.api in ("FSDP1", "fully_shard") or (call.method in ("prepare", "train") and a.rank_guard(step) is None):
            return None
        if not _is_collective(a, call):
            continue
        if a.rank_guard(step) is not None or a.exclusive(heavy_step, step):
            continue
        return call
    return None


def _timeout_raised(a) -> bool:
    for call in a.calls("init_process_group"):
        if a.keyword(call, "timeout") is not None:
            return True
    for call in a.calls("TrainingArguments"):
        if a.keyword(call, "ddp_timeout") is not None:
            return True
    env = getattr(a, "env", None)
    if env is not None and any(name == "ddp_timeout" for name, _ in env.training):
        return True  # `--ddp_timeout 10800` on the command line, or `ddp_timeout:` in the recipe it names
    for call in a.c.calls:
        if call.qualname in _INIT_KWARGS or (call.qualname or "").endswith("PartialState"):
            if a.keyword(call, "timeout") is not None:
                return True
    return False


def _default_timeout(a) -> str:
    if a.calls("Trainer", "TrainingArguments"):
        return f"{TRAINER_DEFAULT_S} s (TrainingArguments.ddp_timeout)"
    backends = {a.value(c.arg(0, "backend"), c.scope) for c in a.calls("init_process_group")}
    if backends and not (backends & {"nccl"}) and all(isinstance(b, str) for b in backends):
        return f"{OTHER_DEFAULT_S} s (torch's default for {', '.join(sorted(backends))})"
    return f"{NCCL_DEFAULT_S} s for NCCL (torch 2.13 default_pg_nccl_timeout; {OTHER_DEFAULT_S} s for gloo)"
