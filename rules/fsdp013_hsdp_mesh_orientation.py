import re

import libcst as cst

from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule

# Expressions that count the devices of one node (the size of an intra-node shard group).
_PER_NODE = re.compile(
    r"device_count\(\)|local_world_size|LOCAL_WORLD_SIZE|gpus?_per_node|nproc_per_node|devices_per_node|"
    r"NPROC_PER_NODE|GPUS_PER_NODE",
    re.I,
)
# Expressions that count nodes (the replicate dimension).
_NODES = re.compile(r"\bn_?nodes\b|num_nodes|node_count|NNODES|NUM_NODES|world_size(\(\))?\s*//", re.I)


class HsdpMeshOrientation(Rule):
    code = "FSDP013"
    name = "hsdp-mesh-orientation"
    severity = Severity.WARNING
    sides = "S"
    summary = "2-D device mesh given as (shard, replicate) instead of (replicate, shard)."
    message = (
        "This 2-D mesh is laid out as (shard, replicate) — {why} — but FSDP reads dim 0 as the replicate "
        "dimension and dim 1 as the shard dimension, whatever the dim names say. Parameters get sharded across "
        "nodes and replicated inside a node: slower and more memory per GPU than intended. Build the mesh as "
        "(num_nodes, gpus_per_node) with mesh_dim_names=(\"replicate\", \"shard\")."
    )
    doc = """
    ## What it does
    Finds `init_device_mesh(...)` meshes handed to `fully_shard(mesh=...)` or
    `FullyShardedDataParallel(device_mesh=...)` whose layout puts the shard group first: dim names like
    `("shard", "replicate")`, or a shape like `(gpus_per_node, num_nodes)`. Also finds a 2-D mesh given
    to FSDP1 with a strategy that is not hybrid (`FULL_SHARD`, its default, `SHARD_GRAD_OP`, `NO_SHARD`):
    FSDP1 then takes mesh dim 0 alone as its process group (reported as an error: the ranks of different
    dim-0 groups never synchronise).

    ## Why is this bad?
    For HSDP, FSDP2 and FSDP1 (`HYBRID_SHARD`) take mesh dim 0 as the *replicate* dimension and dim 1 as the
    *shard* dimension; the names are labels only. A mesh built as (shard, replicate) silently shards each
    parameter across nodes over the slow inter-node network and replicates it within the node: no error,
    wrong performance and memory profile.

    ## Example
    ```python
    mesh = init_device_mesh("cuda", (gpus_per_node, num_nodes), mesh_dim_names=("shard", "replicate"))
    fully_shard(model, mesh=mesh)
    ```

    ## Use instead
    ```python
    mesh = init_device_mesh("cuda", (num_nodes, gpus_per_node), mesh_dim_names=("replicate", "shard"))
    fully_shard(model, mesh=mesh)
    ```
    A flattened 1-D mesh shards over all ranks.

    ## Fix safety
    No automatic fix: the right shape depends on the cluster layout.

    ## Versions
    All versions of torch with HSDP. FSDP1's use of mesh dim 0 for the non-hybrid strategies was read in
    torch 2.13 (fsdp/_init_utils.py, `_init_process_group_state`); FSDP1 accepts `device_mesh` from torch 2.2.

    ## References
    - pytorch#121023, pytorch#161776; RLinf#1542; NVIDIA-NeMo/Automodel#2768
    - pytorch `fully_shard` docstring ("dim 0 for replication, dim 1 for sharding")
    """
    references = ("pytorch#121023", "pytorch#161776", "RLinf#1542", "NVIDIA-NeMo/Automodel#2768")

    VALID = [
        # FSDP1 FULL_SHARD over a 1-D mesh, or over one named dim of a 2-D mesh.
        """
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        mesh = init_device_mesh("cuda", (world_size,), mesh_dim_names=("dp",))
        model = FSDP(model, device_mesh=mesh)
        """,
        """
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        mesh = init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))
        model = FSDP(model, device_mesh=mesh["dp"])
        """,
        """
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cuda", (num_nodes, gpus_per_node), mesh_dim_names=("replicate", "shard"))
        fully_shard(model, mesh=mesh)
        """,
        # A 2-D mesh for tensor parallelism: not HSDP.
        """
        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cuda", (dp, torch.cuda.device_count()), mesh_dim_names=("dp", "tp"))
        fully_shard(model, mesh=mesh["dp"])
        """,
        # The mesh is sliced in the right order before use.
        """
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        world_mesh = init_device_mesh("cuda", (8, 2), mesh_dim_names=("dp_shard", "dp_replicate"))
        fully_shard(model, mesh=world_mesh["dp_replicate", "dp_shard"])
        """,
        # FSDP1 hybrid with the right orientation, from the node count.
        """
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        mesh = init_device_mesh("cuda", (dist.get_world_size() // torch.cuda.device_count(), torch.cuda.device_count()))
        model = FSDP(model, device_mesh=mesh, sharding_strategy=ShardingStrategy.HYBRID_SHARD)
        """,
    ]
    INVALID = [
        # FSDP1 reads a 2-D mesh only for the HYBRID strategies; FULL_SHARD (the default) uses dim 0 alone.
        Invalid(
            """
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            mesh = init_device_mesh("cuda", (nodes, 8), mesh_dim_names=("replicate", "shard"))
            model = FSDP(model, auto_wrap_policy=policy, device_mesh=mesh)
            """,
            line=4,
            severity="error",
        ),
        Invalid(
            """
            import torch.distributed.fsdp as fsdp
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh("cuda", mesh_shape=(2, 4))
            model = fsdp.FullyShardedDataParallel(model, device_mesh=mesh,
                                                  sharding_strategy=fsdp.ShardingStrategy.SHARD_GRAD_OP)
            """,
            line=4,
            severity="error",
        ),
        Invalid(
            """
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh("cuda", (8, 2), mesh_dim_names=("shard", "replicate"))
            for layer in model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            """,
            line=3,
        ),
        Invalid(
            """
            import torch
            import torch.distributed as dist
            from torch.distributed import init_device_mesh as make_mesh
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
            gpus = torch.cuda.device_count()
            mesh = make_mesh("cuda", (torch.cuda.device_count(), dist.get_world_size() // gpus))
            model = FSDP(model, device_mesh=mesh, sharding_strategy=ShardingStrategy.HYBRID_SHARD)
            """,
            line=6,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as f
            from torch.distributed.device_mesh import init_device_mesh

            def build_mesh(local_world_size, num_nodes):
                return init_device_mesh("cuda", mesh_shape=(local_world_size, num_nodes))

            def shard(model, local_world_size, num_nodes):
                mesh = init_device_mesh("cuda", mesh_shape=(local_world_size, num_nodes))
                f.fully_shard(model, mesh=mesh)
            """,
            line=8,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        seen = set()
        if a.calls("fully_shard", "FSDP1"):
            # Names alone say (shard, replicate): the mesh may reach FSDP through helpers, so follow the names.
            for mesh in a.calls("init_device_mesh"):
                why = _named_shard_first(a, mesh)
                if why and not _sliced_by_name(ctx.source, mesh, a):
                    seen.add(id(mesh.node))
                    ctx.report(mesh.node, self.message.format(why=why))
        self._check_fsdp1_non_hybrid(ctx, a)
        for call in a.calls("fully_shard", "FSDP1"):
            mesh_expr = call.kw("mesh") if call.api == "fully_shard" else call.kw("device_mesh")
            if mesh_expr is None:
                continue
            mesh = a.call_for(mesh_expr, call.scope, "init_device_mesh")
            if mesh is None or id(mesh.node) in seen:
                continue
            seen.add(id(mesh.node))
            why = _shard_first(a, ctx, mesh)
            if why:
                ctx.report(mesh.node, self.message.format(why=why))


    def _check_fsdp1_non_hybrid(self, ctx, a) -> None:
        """FSDP1 takes a 2-D mesh as (replicate, shard) only for the HYBRID strategies; with FULL_SHARD (its
        default), SHARD_GRAD_OP or NO_SHARD its process group is mesh dim 0 alone (torch 2.13
        fsdp/_init_utils.py `_init_process_group_state`: `device_mesh.get_group(mesh_dim=0)`), so it shards
        and reduces gradients only within dim 0's groups."""
        for call in a.calls("FSDP1"):
            mesh_expr = call.kw("device_mesh")
            if mesh_expr is None or call.star_kwargs():
                continue
            mesh = a.call_for(mesh_expr, call.scope, "init_device_mesh")
            if mesh is None or not _two_dims(a, mesh):
                continue
            strategy = call.kw("sharding_strategy")
            if strategy is not None:
                text = ctx.code(strategy) + " " + ctx.code(_follow(a, strategy, call.scope) or strategy)
                m = re.search(r"\b(FULL_SHARD|SHARD_GRAD_OP|NO_SHARD)\b", text)
                if m is None or "HYBRID" in text:
                    continue
                name = m.group(1)
            else:
                name = "FULL_SHARD (the default)"
            ctx.report(
                mesh_expr,
                f"FSDP1 is given a 2-D device mesh with sharding_strategy {name}: only the HYBRID strategies read a "
                "2-D mesh as (replicate, shard); any other strategy takes mesh dim 0 alone as its process group, so "
                "parameters are sharded and gradients reduced only among the ranks of dim 0 (with a (1, N) mesh, "
                "every rank trains its own unsynchronised copy). Pass a 1-D mesh of all ranks for FULL_SHARD, or "
                "use ShardingStrategy.HYBRID_SHARD with (replicate, shard).",
                severity=Severity.ERROR,
            )


def _two_dims(a, mesh) -> bool:
    names = a.value(mesh.kw("mesh_dim_names"), mesh.scope) if mesh.kw("mesh_dim_names") is not None else None
    if isinstance(names, (list, tuple)):
        return len(names) == 2
    shape = _follow(a, mesh.arg(1, "mesh_shape"), mesh.scope)
    return isinstance(shape, (cst.Tuple, cst.List)) and len(shape.elements) == 2


def _dim_names(a, mesh):
    names = a.value(mesh.kw("mesh_dim_names"), mesh.scope)
    if isinstance(names, (list, tuple)) and len(names) == 2 and all(isinstance(n, str) for n in names):
        return list(names)
    return None


def _named_shard_first(a, mesh) -> str:
    names = _dim_names(a, mesh)
    if names is None:
        return ""
    first, second = (n.lower() for n in names)
    if "shard" in first and "rep" not in first and "rep" in second:
        return f"mesh_dim_names={tuple(names)!r}"
    return ""


def _sliced_by_name(source: str, mesh, a) -> bool:
    """`mesh["dp_replicate", "dp_shard"]` somewhere: the user picks dims by name, in their own order."""
    names = _dim_names(a, mesh) or []
    return any(re.search(r"\[\s*[\"']" + re.escape(n) + r"[\"']", source) for n in names)


def _shard_first(a, ctx, mesh) -> str:
    """Why this mesh puts the shard group in dim 0, or ''."""
    if _dim_names(a, mesh) is not None:
        # named in the right order, or not an HSDP mesh (e.g. ("dp", "tp"))
        return "" if _sliced_by_name(ctx.source, mesh, a) else _named_shard_first(a, mesh)
    shape = mesh.arg(1, "mesh_shape")
    shape = _follow(a, shape, mesh.scope)
    if not isinstance(shape, (cst.Tuple, cst.List)) or len(shape.elements) != 2:
        return ""
    d0, d1 = (_text(a, ctx, el.value, mesh.scope) for el in shape.elements)
    if _PER_NODE.search(d0) and not _NODES.search(d0) and _NODES.search(d1):
        return f"shape ({ctx.code(shape.elements[0].value)}, {ctx.code(shape.elements[1].value)}) puts the devices of one node first"
    return ""


def _follow(a, expr, scope):
    for _ in range(3):
        if isinstance(expr, cst.Name):
            expr = a.binding(expr.value, scope)
        else:
            break
    return expr


def _text(a, ctx, expr, scope) -> str:
    """Source of an expression, with a simple name replaced by what it is bound to."""
    text = ctx.code(expr)
    if isinstance(expr, cst.Name):
        bound = a.binding(expr.value, scope)
        if bound is not None:
            text += " " + ctx.code(bound)
    return text
