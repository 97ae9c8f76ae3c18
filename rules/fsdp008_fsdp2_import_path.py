import libcst as cst

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
        severity = ctx.version_severity(tv)
        c = ctx.analysis.c
        for node, guards in c.import_froms:
            if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
                continue
            module = dotted(node.module) or ""
            names = [a.name.value if isinstance(a.name, cst.Name) else dotted(a.name) or "" for a in node.names]
            hits = [n for n in names if _is_new_path(module, n)]
            if hits and not _guarded(guards):
                name = "fully_shard" if "fully_shard" in hits else hits[0]
                ctx.report(node, self.message.format(name=name, module=module, torch=tv.describe()), severity=severity)
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
