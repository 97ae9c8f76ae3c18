import re

import libcst as cst

from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid

# Classes that are one routed expert (transformers' v4 MoE blocks and the usual custom names).
# (Not "...Experts" containers, not shared experts, which run for every token.)
_EXPERT_CLASS = re.compile(r"^(?!.*Shared).*(Expert(?!s)|BlockSparseTop2MLP)")
_WRAPPERS = ("fully_shard", "FSDP1", "fsdp_wrap")
# A unit at or below one element of a routed-experts container: `...experts.3`, `...experts.expert_0.wi`.
_IN_ONE_EXPERT = re.compile(r"^(?:(?P<owner>.*)\.)?experts\.(?P<key>[^.]+)(?:\.|$)")
_ROUTER_NAMES = ("router", "gate")

# transformers' Switch Transformers keeps one module per routed expert (`mlp.experts.expert_<i>`) and its
# `SwitchTransformersExperts.forward` runs only the experts that were hit (`expert_hit = ...nonzero()`).
_SWITCH = {"model_type": "switch_transformers", "architectures": ["SwitchTransformersForConditionalGeneration"],
           "d_model": 64, "d_ff": 128, "d_kv": 16, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
           "num_experts": 4, "vocab_size": 256, "encoder_sparse_step": 1, "decoder_sparse_step": 1,
           "torch_dtype": "bfloat16"}
_SWITCH_LORA = {"r": 8, "target_modules": ["q", "v"]}


class DataDependentFsdpUnit(Rule):
    code = "FSDP019"
    name = "data-dependent-fsdp-unit"
    severity = Severity.ERROR
    sides = "SA"
    summary = (
        "an FSDP unit per routed MoE expert (per-expert `fully_shard`/`FSDP`, or a wrap policy naming the expert "
        "class): ranks whose tokens skip an expert issue different all-gathers (hang or silently wrong weights)"
    )
    versions = {"torch": ">=2.0"}
    doc = """
    ## What it does
    Finds FSDP units that contain a single routed expert of a mixture-of-experts layer: `fully_shard(expert)`
    / `FSDP(expert)` / `wrap(expert)` inside a loop over `<moe>.experts`, and FSDP1 wrap policies
    (`ModuleWrapPolicy`, `transformer_auto_wrap_policy(transformer_layer_cls=...)`, accelerate's
    `fsdp_transformer_layer_cls_to_wrap`) that name an expert class (`...Expert`, `MixtralBlockSparseTop2MLP`).
    The model audit reports planned units that sit inside one element of a routed-experts container (an
    `experts` ModuleList/ModuleDict next to a `router`/`gate`), e.g. Switch Transformers'
    `mlp.experts.expert_0` when the wrap list names `SwitchTransformersDenseActDense`.

    ## Why is this bad?
    An FSDP unit all-gathers its parameters when its forward runs. A router sends each rank's tokens to
    different experts, and MoE blocks skip the experts that received no token (transformers' Mixtral loops
    only over the experts hit). Then rank 0 runs expert 3's forward — and its all-gather — while rank 1
    does not: the ranks issue different collective sequences. When the sizes differ the job hangs with no
    error after a few steps (pytorch#126616); when they match (experts of one shape) the collectives pair up
    across experts and each rank silently computes with another expert's weights — measured with torch 2.13
    FSDP2 on 2 gloo ranks, a 4-expert MoE with per-expert `fully_shard` and rank-dependent routing: the
    forward differs from the unsharded model on both ranks, and matches it when the MoE block is one unit.
    The same holds for units inside any code path that runs on some ranks only (layer drop, early exit).

    ## Example
    ```python
    for layer in model.model.layers:
        for expert in layer.block_sparse_moe.experts:
            fully_shard(expert)
        fully_shard(layer)
    ```

    ## Use instead
    Make the MoE block — the module every token passes through — the unit, or leave the experts in the
    decoder layer's unit:
    ```python
    for layer in model.model.layers:
        fully_shard(layer.block_sparse_moe)  # router + all experts: gathered on every rank, every step
        fully_shard(layer)
    ```
    Not `fully_shard(layer.block_sparse_moe.experts)` when `experts` is an `nn.ModuleList`: a ModuleList is
    never called, so its forward pre-hook never gathers the experts. (A fused experts module with its own
    `forward`, as in transformers 5 or torchtitan's `GroupedExperts`, is fine as one unit.) FSDP1: wrap the
    decoder layer class, not the expert class. Expert parallelism (experts placed on different ranks) needs
    its own process groups and token dispatch, not per-expert FSDP units.

    ## Fix safety
    No automatic fix: the wrap granularity changes memory use.

    ## Versions
    All torch versions, FSDP1 and FSDP2. transformers 5 fuses each layer's experts into 3-D parameters of
    one module, so per-expert modules come from transformers 4 models and custom MoE code.

    ## References
    - pytorch#126616 ("FSDP hangs when combing MoE architecture": a wrap policy making each expert a unit)
    - pytorch#149396 (one unit for a layer's fused experts module)
    - torch src torch/distributed/fsdp/_fully_shard/_fully_shard.py (the unit's forward pre-hook all-gathers)
    """
    references = ("pytorch#126616", "pytorch#149396")

    VALID = [
        # The MoE block (router and every expert) as one unit.
        """
        from torch.distributed.fsdp import fully_shard
        for layer in model.model.layers:
            fully_shard(layer.block_sparse_moe)
            fully_shard(layer)
        fully_shard(model)
        """,
        # A fused experts module (transformers 5, torchtitan GroupedExperts) runs for every token batch.
        """
        from torch.distributed.fsdp import fully_shard
        for block in model.layers.values():
            fully_shard(block.moe.experts)
            fully_shard(block)
        """,
        # Decoder-layer policy.
        """
        import functools
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={MixtralDecoderLayer})
        model = FSDP(model, auto_wrap_policy=policy)
        """,
        # The shared expert runs for every token; the MoE block is one unit.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock, Qwen2MoeSharedExpert
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Qwen2MoeSparseMoeBlock, Qwen2MoeSharedExpert}))
        """,
        # Dense MLPs per layer: every rank runs every unit.
        """
        from torch.distributed.fsdp import fully_shard
        for layer in model.layers:
            fully_shard(layer.mlp)
            fully_shard(layer)
        """,
        # accelerate wraps the decoder layers: every expert stays in its layer's unit.
        Valid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, opt = accelerator.prepare(model, opt)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"
                                          "  fsdp_transformer_layer_cls_to_wrap: MixtralDecoderLayer\n"},
        ),
    ]
    INVALID = [
        # The policy spelled as torch's private partial (the reporter's script in pytorch#126616).
        Invalid(
            """
            import functools
            from torch import nn
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp.wrap import _module_wrap_policy

            class Expert(nn.Module):
                pass

            policy = functools.partial(_module_wrap_policy, module_classes={Expert})
            model = FSDP(Net(), auto_wrap_policy=policy)
            """,
            line=9,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import fully_shard
            for layer in model.model.layers:
                for expert in layer.block_sparse_moe.experts:
                    fully_shard(expert)
                fully_shard(layer)
            fully_shard(model)
            """,
            line=4,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            from transformers.models.mixtral.modeling_mixtral import MixtralBlockSparseTop2MLP, MixtralDecoderLayer
            model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({MixtralDecoderLayer, MixtralBlockSparseTop2MLP}))
            """,
            line=4,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as fsdp

            class MoE(torch.nn.Module):
                def shard(self):
                    for i, e in enumerate(self.experts):
                        self.experts[i] = fsdp.FullyShardedDataParallel(e)
            """,
            line=6,
        ),
        # accelerate's TRANSFORMER_BASED_WRAP naming the expert class.
        Invalid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, opt = accelerator.prepare(model, opt)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"
                                          "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                                          "  fsdp_transformer_layer_cls_to_wrap: MixtralDecoderLayer,"
                                          "MixtralBlockSparseTop2MLP\n"},
        ),
    ]

    AUDIT_VALID = [
        spec(model=_SWITCH, lora=_SWITCH_LORA, fsdp={"wrap": ["SwitchTransformersBlock"]}),
        spec(model=_SWITCH, lora=_SWITCH_LORA, fsdp={"wrap": ["SwitchTransformersSparseMLP", "SwitchTransformersBlock"]}),
        spec("mixtral", fsdp={"wrap": ["MixtralDecoderLayer"]}),
    ]
    AUDIT_INVALID = [
        spec(model=_SWITCH, lora=_SWITCH_LORA, fsdp={"wrap": ["SwitchTransformersBlock", "SwitchTransformersDenseActDense"]}),
        spec(model=_SWITCH, lora=_SWITCH_LORA,
             fsdp={"version": 1, "use_orig_params": True,
                   "wrap": ["SwitchTransformersBlock", "SwitchTransformersDenseActDense"]}),
    ]

    def audit(self, ctx) -> None:
        """Planned units that sit inside one element of a routed-experts container (a module holding
        `experts` next to a router/gate)."""
        model = ctx.built.model
        modules = dict(model.named_modules())
        hits = []
        for unit in ctx.plan.units:
            m = _IN_ONE_EXPERT.match(unit.name or "")
            if m is None:
                continue
            owner = modules.get(m.group("owner") or "")
            if owner is None or not any(any(r in n for r in _ROUTER_NAMES) for n, _ in owner.named_children()):
                continue
            hits.append(unit.name)
        if not hits:
            return
        ctx.report(
            self,
            f"{len(hits)} FSDP unit(s) hold a single routed expert ({hits[0]}{', ...' if len(hits) > 1 else ''}): "
            + _WHY,
            unit=hits[0],
            field="fsdp.wrap",
        )

    def check(self, ctx) -> None:
        a = ctx.analysis
        for call in a.c.calls:
            if call.api in _WRAPPERS:
                target = call.arg(0, "module")
                if _per_expert(call, target):
                    ctx.report(call.node, _message("each routed expert is wrapped as its own FSDP unit"))
                    continue
            partial_of = (a.resolver.qualify(call.arg(0)) or "") if (
                call.api == "functools_partial" and call.arg(0) is not None) else ""
            if call.api in ("ModuleWrapPolicy", "transformer_auto_wrap_policy") or partial_of.endswith(
                ("transformer_auto_wrap_policy", "_module_wrap_policy")
            ):
                # functools.partial(_module_wrap_policy, module_classes={Expert}) is what ModuleWrapPolicy does.
                classes = call.kw("transformer_layer_cls") or call.kw("module_classes") or (
                    call.arg(0, "module_classes") if call.api == "ModuleWrapPolicy" else None)
                name = _expert_class(a, classes)
                if name:
                    ctx.report(call.node, _message(f"the wrap policy makes every `{name}` (one routed expert) a unit"))
        launch = getattr(a, "launch", None)
        if launch is not None and launch.fsdp_version is not None:
            s = launch.get("transformer_layer_cls_to_wrap")
            if s is not None and any(_EXPERT_CLASS.search(n.strip()) for n in str(s.value).split(",")):
                ctx.report_setting(s, _message(f"fsdp_transformer_layer_cls_to_wrap ({s.value}) makes every routed "
                                               "expert a unit"))


_WHY = (
    "an expert's unit all-gathers only when its forward runs, and the router sends each rank's tokens to different "
    "experts (MoE blocks skip experts that got no token), so ranks issue different all-gathers: the job hangs "
    "(pytorch#126616) or, with same-shaped experts, ranks silently compute with each other's expert weights. Make "
    "the MoE block the unit (fully_shard(layer.moe)) or leave the experts in the decoder layer's unit."
)


def _message(what: str) -> str:
    return f"{what}: {_WHY}"


def _per_expert(call, target) -> bool:
    """`for e in moe.experts: fully_shard(e)` (also enumerate / .children() / .values() / experts[i])."""
    if target is None:
        return False
    if isinstance(target, cst.Subscript):
        d = dotted(target.value)
        return bool(d and d.split(".")[-1] == "experts" and call.loops)
    name = dotted(target)
    if name is None or "." in name:
        return False
    for loop in call.loops:
        if name not in loop.target.split(","):
            continue
        it = loop.iter
        for _ in range(3):
            if isinstance(it, cst.Call) and it.args and dotted(it.func) in ("enumerate", "list", "reversed"):
                it = it.args[0].value
            elif isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute) and it.func.attr.value in (
                    "children", "values", "modules"):
                it = it.func.value
        d = dotted(it)
        return bool(d and d.split(".")[-1] == "experts")
    return False


def _expert_class(a, classes):
    if classes is None:
        return None
    elements = classes.elements if isinstance(classes, (cst.Set, cst.List, cst.Tuple)) else [classes]
    for el in elements:
        expr = getattr(el, "value", el)
        d = dotted(expr)
        name = d.split(".")[-1] if d else None
        if name is None and isinstance(expr, cst.SimpleString):
            name = expr.evaluated_value
        if name and _EXPERT_CLASS.search(name):
            return name
    return None
