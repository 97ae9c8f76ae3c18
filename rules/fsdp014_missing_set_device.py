import re

import libcst as cst

from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import InsertLinesAfter, safe
from fsdplint.rule import Invalid, Rule
from fsdplint.rules._unread import unread_names

# Names scripts use for the local rank, best first.
LOCAL_RANK_NAMES = ("local_rank", "LOCAL_RANK", "local_rank_id", "lrank", "gpu_id", "device_id")
# Launch setups that give every process exactly one visible device, so device 0 is the right one.
ONE_DEVICE_PER_PROCESS = re.compile(r"CUDA_VISIBLE_DEVICES|HIP_VISIBLE_DEVICES")
# Names of functions that may select the device when their code is not read (`utils.get_device(...)`,
# `init_distributed_mode(args)`, `setup(rank)` imported from a module that cannot be found).
MAY_SET_DEVICE = re.compile(r"device|distrib|(^|_)dist($|_)|(^|_)(setup|ddp|accelerator|gpu)($|_)|local_rank", re.I)


class MissingSetDevice(Rule):
    code = "FSDP014"
    name = "missing-set-device"
    severity = Severity.ERROR
    sides = "S"
    fix = Applicability.SAFE
    summary = "Process group initialised without `torch.cuda.set_device(local_rank)` / `device_id`."
    message = (
        "The process group is initialised but the current CUDA device is never set: every rank keeps device 0, "
        "so FSDP puts its shards and collectives on the wrong GPU (\"Expects tensor to be on the compute device "
        "cuda:1\", or all ranks crowd onto GPU 0). Call torch.cuda.set_device(local_rank) right after "
        "init_process_group, before the model and FSDP are built."
    )
    doc = """
    ## What it does
    Finds scripts that call `torch.distributed.init_process_group(...)` and use FSDP (`FullyShardedDataParallel`
    or `fully_shard`) but never call `torch.cuda.set_device(...)` (or `torch.accelerator.set_device_index`) and
    do not pass `device_id=` to `init_process_group`.

    ## Why is this bad?
    FSDP takes the *current* device as the compute device: FSDP2 builds its mesh on
    `torch.cuda.current_device()`, and NCCL collectives run there. Without `set_device`, every process on a
    node has device 0 as its current device: ranks > 0 fail with `AssertionError: Expects tensor to be on
    the compute device cuda:1`, or all ranks allocate on GPU 0 and run out of memory.

    ## Example
    ```python
    dist.init_process_group("nccl")
    model = FSDP(model)
    ```

    ## Use instead
    ```python
    dist.init_process_group("nccl")
    torch.cuda.set_device(local_rank)
    model = FSDP(model, device_id=local_rank)
    ```

    ## Fix safety
    Safe: the fix inserts `torch.cuda.set_device(local_rank)` after `init_process_group`, using the script's
    own `local_rank` variable, or `int(os.environ["LOCAL_RANK"])` (set by `torchrun`) when `os` is imported.
    No fix is offered when neither is available.

    ## Versions
    All versions of torch.

    ## References
    - pytorch#112658
    - https://pytorch.org/tutorials/intermediate/FSDP_tutorial.html
    """
    references = ("pytorch#112658",)

    VALID = [
        """
        import os
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        local_rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("nccl")
        torch.cuda.set_device(local_rank)
        model = FSDP(model)
        """,
        # device_id on init_process_group binds the device too.
        """
        import os
        import torch
        from torch.distributed import init_process_group
        from torch.distributed.fsdp import fully_shard
        local_rank = int(os.environ["LOCAL_RANK"])
        init_process_group(backend="nccl", device_id=torch.device("cuda", local_rank))
        fully_shard(model)
        """,
        # set_device in a helper function of the same file, called before the init.
        """
        import torch
        import torch.distributed as dist
        import torch.distributed.fsdp as f

        def setup(rank):
            torch.cuda.set_device(rank)
            dist.init_process_group("nccl")

        def main(rank):
            setup(rank)
            for layer in model.layers:
                f.fully_shard(layer)
            f.fully_shard(model)
        """,
        # Device-agnostic code (torchtitan style).
        """
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        device_module = getattr(torch, device_type)
        dist.init_process_group(backend)
        device_module.set_device(torch.device(f"{device_type}:{local_rank}"))
        fully_shard(model)
        """,
        # gloo on CPU: there is no device to select.
        """
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        dist.init_process_group(backend="gloo")
        fully_shard(model)
        """,
        # No FSDP in this file: not this rule's business.
        """
        import torch.distributed as dist
        dist.init_process_group("nccl")
        """,
        # One visible GPU per process: device 0 is the right one.
        """
        import os
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["LOCAL_RANK"]
        dist.init_process_group("nccl")
        fully_shard(model)
        """,
        # A library helper forwards the caller's kwargs (which may hold device_id) (torchtune's init_distributed).
        """
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        def init_distributed(**kwargs):
            dist.init_process_group(**kwargs)

        def shard(model):
            fully_shard(model)
        """,
        # Initialised only when the launcher has not done it (Ray workers see one GPU each; verl's workers).
        """
        import torch.distributed
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        class Worker:
            def __init__(self, config):
                if not torch.distributed.is_initialized():
                    torch.distributed.init_process_group(backend=f"cpu:gloo,{get_device_name()}:nccl")
                self.model = FSDP(build_model(config), device_id=get_device_id())
        """,
    ]
    INVALID = [
        Invalid(
            """
            import os
            import torch
            import torch.distributed as dist
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            local_rank = int(os.environ["LOCAL_RANK"])
            dist.init_process_group("nccl")
            model = FSDP(model, device_id=local_rank)
            """,
            line=6,
            expected_fix="""
            import os
            import torch
            import torch.distributed as dist
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            local_rank = int(os.environ["LOCAL_RANK"])
            dist.init_process_group("nccl")
            torch.cuda.set_device(local_rank)
            model = FSDP(model, device_id=local_rank)
            """,
        ),
        Invalid(
            """
            import os
            import torch as th
            from torch.distributed import init_process_group as init_pg
            import torch.distributed.fsdp as f

            def main():
                init_pg(backend="nccl")
                for layer in model.layers:
                    f.fully_shard(layer)
                f.fully_shard(model)
            """,
            line=7,
            expected_fix="""
            import os
            import torch as th
            from torch.distributed import init_process_group as init_pg
            import torch.distributed.fsdp as f

            def main():
                init_pg(backend="nccl")
                th.cuda.set_device(int(os.environ["LOCAL_RANK"]))
                for layer in model.layers:
                    f.fully_shard(layer)
                f.fully_shard(model)
            """,
        ),
        # No local rank variable and no `os`: reported without a fix.
        Invalid(
            """
            import torch.distributed as dist
            from torch.distributed._composable.fsdp import fully_shard
            dist.init_process_group()
            fully_shard(model)
            """,
            line=3,
        ),
        Invalid(
            """
            import torch
            import torch.distributed as dist
            from torch.distributed.fsdp import FullyShardedDataParallel

            def main(args):
                dist.init_process_group("nccl", rank=args.rank, world_size=args.world_size)
                model = FullyShardedDataParallel(build(), device_id=torch.cuda.current_device())
            """,
            line=6,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        inits = a.calls("init_process_group")
        if not inits or not (a.calls("FSDP1") or a.calls("fully_shard")):
            return
        if a.calls("cuda_set_device") or a.method_calls("set_device", "set_device_index"):
            return  # also `device_module.set_device(...)` through a device-agnostic handle
        if ONE_DEVICE_PER_PROCESS.search(ctx.source):
            return
        for init in inits:
            if a.keyword(init, "device_id") is not None:
                return  # passed, or maybe passed through `**kwargs`
            if any(g.kind == "other" and g.branch == "body" and "is_initialized" in a.code(g.node.test)
                   for g in init.guards if isinstance(g.node, cst.If)):
                return  # `if not dist.is_initialized():` library code: the launcher may set up the devices
        for init in inits:
            backend = a.value(init.arg(0, "backend"), init.scope)
            if isinstance(backend, str) and "nccl" not in backend and "cuda" not in backend:
                continue  # gloo / mpi on CPU
            unseen = a.unseen(MAY_SET_DEVICE, effect=MAY_SET_DEVICE)
            if unseen:
                # "Never set" is proven only when every call that could set it was read.
                names = unread_names(ctx, unseen)
                more = f" and {len(unseen) - 3} more" if len(unseen) > 3 else ""
                ctx.report(init.node, (
                    f"The process group is initialised and no code that was read sets the CUDA device, but {names}"
                    f"{more} was not read and may set it. If nothing does, every rank keeps device 0: call "
                    "torch.cuda.set_device(local_rank) right after init_process_group."), severity=Severity.WARNING)
                return
            ctx.report(init.node, self.message, fix=_fix(ctx, init))
            return


def _fix(ctx, init):
    stmt = init.stmt
    if stmt is None or not isinstance(stmt.node, cst.SimpleStatementLine) or len(stmt.node.body) != 1:
        return None
    torch_name = next((local for local, q in ctx.analysis.resolver.names.items() if q == "torch"), None)
    if torch_name is None:
        return None
    rank = _local_rank_expr(ctx, init)
    if rank is None:
        return None
    return safe(
        "Set the CUDA device after init_process_group",
        InsertLinesAfter(stmt.node, f"{torch_name}.cuda.set_device({rank})"),
    )


def _local_rank_expr(ctx, init):
    """The script's own local-rank expression bound before the init, else `int(os.environ["LOCAL_RANK"])`."""
    a = ctx.analysis
    for scope in (init.scope, a.c.module_scope):
        for name in LOCAL_RANK_NAMES:
            if name in scope.params:
                return name
            binds = scope.assigns.get(name)
            if binds and binds[0][0] <= init.seq:
                return name
    if a.resolver.names.get("os") == "os":
        return 'int(os.environ["LOCAL_RANK"])'
    return None
