import libcst as cst
from packaging.version import Version

from fsdplint.apis import FULLY_SHARD_PUBLIC_PATH_SINCE
from fsdplint.findings import Severity
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid

PUBLIC = "torch.distributed.fsdp"
# The FSDP2 names that `torch.distributed.fsdp` only exports since torch 2.6 (FSDP1 names were always there).
FSDP2_NAMES = {
    "fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy",
    "register_fsdp_forward_method", "UnshardHandle",
}
# Packages that only exist since 2.6.
NEW_PACKAGES = ("torch.distributed.fsdp._fully_shard",)


class Fsdp2ImportPath(Rule):
    code = "FSDP008"
    name = "fsdp2-import-path"
    severity = Severity.ERROR
    sides = "S"
    versions = {"torch": "<2.6"}
    summary = (
        "`fully_shard` imported from a path the target torch lacks (`torch.distributed.fsdp` needs >= 2.6; "
        "`torch.distributed._composable.fsdp` for 2.4-2.5)"
    )
    message = (
        "`{name}` is imported from `{module}`, which exports it only since torch 2.6; the target is {torch}, "
        "where this raises ImportError. Import it from `torch.distributed._composable.fsdp` (works on 2.4 and "
        "later), guard the import with try/except ImportError, or require torch>=2.6."
    )
    doc = """
    ## What it does
    Finds FSDP2 names (`fully_shard`, `FSDPModule`, `MixedPrecisionPolicy`, `OffloadPolicy`,
    `register_fsdp_forward_method`, ...) imported from or called through `torch.distributed.fsdp` when the
    project targets a torch release older than 2.6.

    ## Why is this bad?
    FSDP2 lived in `torch.distributed._composable.fsdp` until torch 2.6 made it public as
    `torch.distributed.fsdp.fully_shard`. On torch 2.4 and 2.5 the public import fails with
    `ImportError: cannot import name 'fully_shard' from 'torch.distributed.fsdp'`, on every rank, at start-up.

    ## Example
    ```python
    # requirements.txt: torch==2.5.1
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    ```

    ## Use instead
    ```python
    try:
        from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard, MixedPrecisionPolicy
    ```
    `torch.distributed._composable.fsdp` still imports (the same objects) on current releases.

    ## Fix safety
    No automatic fix: whether to raise the torch floor or keep the old path is a project decision.

    ## Versions
    torch 2.4 and 2.5. The target version comes from the project (lock file, requirements, pyproject,
    `[tool.fsdplint]`), or the installed torch; the message says which one was used. A project that
    declares no torch and has none installed is not judged on a guess: its unguarded import of the public
    FSDP2 path is itself what it needs (torch >= 2.6), so nothing is reported.

    ## References
    - pytorch `torch/distributed/fsdp/__init__.py` (FSDP2 exports, torch 2.6)
    - https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html
    """
    references = ()

    VALID = [
        Valid(
            """
            from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
            fully_shard(model, mp_policy=MixedPrecisionPolicy())
            """,
            target={"torch": "2.6"},
        ),
        """
        from torch.distributed._composable.fsdp import fully_shard, MixedPrecisionPolicy
        fully_shard(model)
        """,
        # FSDP1 names were always public.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy
        model = FSDP(model, mixed_precision=MixedPrecision(param_dtype=torch.bfloat16))
        """,
        """
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard
        fully_shard(model)
        """,
        """
        import torch
        from packaging import version
        if version.parse(torch.__version__) >= version.parse("2.6"):
            from torch.distributed.fsdp import fully_shard
        else:
            from torch.distributed._composable.fsdp import fully_shard
        """,
        # The project declares an old floor (a library's), but this job uses accelerate's FSDP2, which refuses
        # torch < 2.6 (accelerate >= 1.7 FullyShardedDataParallelPlugin): the import cannot meet torch < 2.6.
        Valid(
            """
            from accelerate import Accelerator, FullyShardedDataParallelPlugin
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
            accelerator = Accelerator(fsdp_plugin=plugin)
            """,
            target={"torch": "2.0", "accelerate": "1.15.0"},
        ),
        # A constructor that refuses torch < 2.6 guards the imports in every method of its class.
        Valid(
            """
            from accelerate.utils import is_torch_version

            class Engine:
                def __init__(self):
                    if not is_torch_version(">=", "2.6.0"):
                        raise ImportError("FSDP2 requires torch >= 2.6")

                def shard(self, model):
                    from torch.distributed.fsdp import fully_shard
                    fully_shard(model)
            """,
            target={"torch": "2.4"},
        ),
        # No torch floor declared and none installed: the module's own unguarded FSDP2 import is what it
        # needs (torch >= 2.6) and what its authors run; that is not an error.
        """
        from torch.distributed.fsdp import FSDPModule, fully_shard
        fully_shard(model)
        assert isinstance(model, FSDPModule)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
            fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
            """,
            target={"torch": "2.4"},
            line=2,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as f

            def shard(model):
                for layer in model.layers:
                    f.fully_shard(layer)
                f.fully_shard(model)
            """,
            target={"torch": "2.5.1"},
            line=5,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import FSDPModule as Sharded
            assert isinstance(model, Sharded)
            """,
            target={"torch": "2.5"},
            line=1,
        ),
        Invalid(
            """
            from torch.distributed.fsdp._fully_shard import fully_shard
            fully_shard(model)
            """,
            target={"torch": "2.5.1"},
            line=1,
        ),
    ]

    def check(self, ctx) -> None:
        tv = ctx.version("torch")
        if not tv < FULLY_SHARD_PUBLIC_PATH_SINCE:
            return  # (an unguarded FSDP2 import proves >= 2.6 when the project declares nothing)
        if tv.kind not in ("installed", "lock"):  # a floor, not the exact environment
            job = ctx.proven_by_job("torch")
            if job is not None and not job.version < Version(FULLY_SHARD_PUBLIC_PATH_SINCE):
                return  # the declared floor is the library's; this job's FSDP2 already needs torch >= 2.6
        severity = ctx.version_severity(tv)
        package_module = ctx.path is not None and (ctx.path.parent / "__init__.py").is_file()
        c = ctx.analysis.c
        for node, guards in c.import_froms:
            if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
                continue
            module = dotted(node.module) or ""
            names = [a.name.value if isinstance(a.name, cst.Name) else dotted(a.name) or "" for a in node.names]
            hits = [n for n in names if _is_new_path(module, n)]
            if hits and not _guarded(guards):
                name = "fully_shard" if "fully_shard" in hits else hits[0]
                sev = severity
                scope = c._import_scopes.get(id(node), (None, 0))[0]
                if package_module and scope is not None and scope.node is not None:
                    # A library's lazy import runs only when its FSDP2 path is chosen, which the library may
                    # gate elsewhere (accelerate's plugin refuses torch < 2.6): not reported for an FSDP2
                    # function or class, a warning otherwise.
                    if "fsdp2" in f"{scope.klass or ''}.{scope.name}".lower():
                        continue
                    sev = Severity.WARNING
                ctx.report(node, self.message.format(name=name, module=module, torch=tv.describe()), severity=sev)
        seen: set[str] = set()
        for call in c.calls:
            q = call.qualname
            if not isinstance(call.node.func, cst.Attribute) or not q or q in seen:
                continue
            module, _, name = q.rpartition(".")
            if _is_new_path(module, name) and not _guarded(call.guards):  # guards last: they cost a codegen
                seen.add(q)  # one finding per name is enough
                ctx.report(call.node, self.message.format(name=name, module=module, torch=tv.describe()),
                           severity=severity)


def _guarded(guards) -> bool:
    """Inside `try: ... except ImportError` or a version/feature check."""
    return any(g.kind in ("version", "import_error") for g in guards)


def _is_new_path(module: str, name: str) -> bool:
    if module.startswith(NEW_PACKAGES):
        return True
    return module == PUBLIC and name in FSDP2_NAMES
