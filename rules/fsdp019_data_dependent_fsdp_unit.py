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
        "class), or FSDP units skipped by a random draw (layer drop): ranks that skip a unit issue different "
        "all-gathers (hang or silently wrong weights)"
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
    It also finds layer drop over FSDP units: a module's loop `for layer in self.layers:` that calls
    `layer(...)` only when a process-global random draw allows it (`if np.random.random() > p:`, `if
    torch.rand(()) < p: continue`, through local names too), where each element of `self.layers` is an FSDP
    unit — wrapped where the list is built (`FSDP(...)`, `fully_shard(...)`, fairseq's `fsdp_wrap(...)`) or
    by a per-element wrap in the same file (`for block in model.layers: fully_shard(block)`).

    ## Why is this bad?
    An FSDP unit all-gathers its parameters when its forward runs. A router sends each rank's tokens to
    different experts, and MoE blocks skip the experts that received no token (transformers' Mixtral loops
    only over the experts hit). Then rank 0 runs expert 3's forward — and its all-gather — while rank 1
    does not: the ranks issue different collective sequences. When the sizes differ the job hangs with no
    error after a few steps (pytorch#126616); when they match (experts of one shape) the collectives pair up
    across experts and each rank silently computes with another expert's weights — measured with torch 2.13
    FSDP2 on 2 gloo ranks, a 4-expert MoE with per-expert `fully_shard` and rank-dependent routing: the
    forward differs from the unsharded model on both ranks, and matches it when the MoE block is one unit.
    The same holds for units inside any code path that runs on some ranks only: with layer drop each rank
    draws its own number from its own generator, so rank 0 skips layer 5 while rank 1 runs it — fairseq
    with `--ddp-backend fully_sharded` and `--encoder-layerdrop` hangs (fairseq#3875). transformers guards
    its own layer drop for this reason: `if not skip_the_layer or synced_gpus:` with `synced_gpus =
    is_deepspeed_zero3_enabled() or is_fsdp_managed_module(self)` (transformers 5.24
    models/wav2vec2/modeling_wav2vec2.py, "under fsdp or deepspeed zero3 all gpus must run in sync").

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
    Layer drop: run every unit on every rank and keep or drop its output (`out = layer(x); x = out if keep
    else x`, as fairseq2#484 does), or take the decision from a generator seeded alike on every rank.
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
    - fairseq#3875, fairscale#796 (layer drop with each layer an FSDP unit hangs); fairseq2#484 (runs the
      dropped layers and discards their output)
    - fairseq src fairseq/distributed/fully_sharded_data_parallel.py (`fsdp_wrap` wraps with FSDP inside
      `fsdp_enable_wrap`)
    - torch src torch/distributed/fsdp/_fully_shard/_fully_shard.py (the unit's forward pre-hook all-gathers)
    """
    references = ("pytorch#126616", "pytorch#149396", "fairseq#3875")

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
        # Layer drop that runs the unit on every rank and drops only its output.
        """
        import numpy as np
        from torch import nn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        class Stack(nn.Module):
            def __init__(self, blocks, p):
                super().__init__()
                self.p = p
                self.blocks = nn.ModuleList([FSDP(b) for b in blocks])

            def forward(self, h):
                for block in self.blocks:
                    out = block(h)
                    if not self.training or np.random.random() > self.p:
                        h = out
                return h
        """,
        # The skip can never happen under FSDP (transformers' `synced_gpus` escape), or the draw comes from a
        # generator the script seeds alike on every rank.
        """
        import torch
        from torch import nn
        from torch.distributed.fsdp import fully_shard

        class Tower(nn.Module):
            def forward(self, x, synced_gpus):
                for layer in self.layers:
                    skip = self.training and torch.rand([]) < self.layerdrop
                    if not skip or synced_gpus:
                        x = layer(x)
                for layer in self.extra:
                    if torch.rand((), generator=self.shared_gen) > self.layerdrop:
                        x = layer(x)
                return x

        def shard(model):
            for layer in model.layers:
                fully_shard(layer)
            for layer in model.extra:
                fully_shard(layer)
            fully_shard(model)
        """,
        # Layer drop where the layers are not units of their own (one unit for the whole model).
        """
        import random
        from torch import nn
        from torch.distributed.fsdp import fully_shard

        class Tower(nn.Module):
            def forward(self, x):
                for layer in self.layers:
                    if random.random() > self.layerdrop:
                        x = layer(x)
                return x

        fully_shard(model)
        """,
    ]
    INVALID = [
        # Layer drop over FSDP1 units built in __init__: each rank skips its own blocks.
        Invalid(
            """
            import torch
            from torch import nn
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            class Stack(nn.Module):
                def __init__(self, blocks, p):
                    super().__init__()
                    self.p = p
                    self.blocks = nn.ModuleList(FSDP(b) for b in blocks)

                def forward(self, h):
                    for block in self.blocks:
                        if self.training and torch.rand(()) < self.p:
                            continue
                        h = block(h)
                    return h
            """,
            line=15,
        ),
        # FSDP2: the layers are sharded one by one elsewhere in the file; the drop goes through a local name.
        Invalid(
            """
            import random
            from torch import nn
            from torch.distributed.fsdp import fully_shard

            class Tower(nn.Module):
                def forward(self, x):
                    for i, layer in enumerate(self.layers):
                        drop = self.training and random.random() < self.drop_rate
                        if not drop:
                            x = layer(x)
                    return x

            def shard(model):
                for layer in model.layers:
                    fully_shard(layer)
                fully_shard(model)
            """,
            line=10,
        ),
        # fairseq's manual wrap: each block appended as its own unit, and `continue` skips it at random.
        Invalid(
            """
            import random
            import torch.nn as nn
            from fairseq.distributed import fsdp_wrap

            class Decoder(nn.Module):
                def __init__(self, cfg):
                    super().__init__()
                    self.drop = cfg.decoder_layerdrop
                    self.blocks = nn.ModuleList()
                    for _ in range(cfg.decoder_layers):
                        self.blocks.append(fsdp_wrap(make_block(cfg)))

                def forward(self, x):
                    for i, blk in enumerate(self.blocks):
                        r = random.uniform(0, 1)
                        if self.training and r < self.drop:
                            continue
                        x = blk(x)
                    return x
            """,
            line=18,
        ),
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
        _random_skips(ctx, a)
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


# -- units skipped by a random draw (layer drop) ---------------------------------------------------------------

# The process-global random number generators: each rank's stream is its own (seeded per rank, or advanced
# a different number of times by data-dependent code), so one rank's draw says nothing about another's.
_RANDOM = re.compile(
    r"^(numpy\.random\.(random|rand|uniform|random_sample|binomial)|random\.(random|uniform|randint|choice)|"
    r"torch\.(rand|randint|bernoulli|randn))$")
_RANDOM_METHODS = ("uniform_", "bernoulli_", "random_")
# fairseq's / fairscale's manual wrap: `fsdp_wrap(layer)` inside the trainer's `fsdp_enable_wrap` context is an
# FSDP unit with the same all-gather in its forward (fairseq/distributed/fully_sharded_data_parallel.py).
_OTHER_WRAPPERS = ("fairseq.distributed.fsdp_wrap", "fairseq.distributed.fully_sharded_data_parallel.fsdp_wrap",
                   "fairscale.nn.wrap", "fairscale.nn.wrap.auto_wrap.wrap", "fairscale.nn.FullyShardedDataParallel")


def _is_wrapper(call) -> bool:
    return call.api in _WRAPPERS or (call.qualname or "") in _OTHER_WRAPPERS


def _random_skips(ctx, a) -> None:
    """`for layer in self.layers: if <random draw>: layer(x)` where each element of `self.layers` is an
    FSDP unit (layer drop): ranks skip different units."""
    for call in a.c.calls:
        if call.api is not None or call.func is None or "." in call.func or not call.loops:
            continue
        loop = next((lp for lp in reversed(call.loops) if call.func in _loop_names(lp)), None)
        if loop is None:
            continue
        attr = _self_attr(loop.iter)
        if attr is None or call.scope.klass is None:
            continue
        cond = _random_condition(a, call, loop)
        if cond is None:
            continue
        wrap = _units_of(a, call.scope.klass, attr)
        if wrap is None:
            continue
        ctx.report(
            call.node,
            f"`{call.func}` (an element of `self.{attr}`, each an FSDP unit: line {ctx.line(wrap.node)}) runs only when "
            f"a random draw says so (line {ctx.line(cond)}): every rank draws its own number, so ranks skip different "
            "units and issue different all-gather/reduce-scatter sequences, and the job hangs (fairseq#3875) or pairs "
            "collectives of different layers. Run every unit on every rank and drop its output instead "
            "(`out = layer(x); x = out if keep else x`), or draw the decision identically on all ranks (a generator "
            "seeded the same everywhere, or a broadcast mask).",
        )


def _loop_names(loop) -> list[str]:
    return [n.strip() for n in loop.target.split(",")]


def _self_attr(it) -> "str | None":
    """`self.layers`, `enumerate(self.layers)`, `self.layers.values()` -> "layers"."""
    d = dotted(_strip_iter(it))
    if d and d.count(".") == 1 and d.startswith("self."):
        return d.split(".")[1]
    return None


def _random_names(a, scope) -> set:
    """Local names whose value comes from a random draw, directly or through other such names."""
    names: set = set()
    for _ in range(3):
        for name, assigns in scope.assigns.items():
            if name not in names and any(_random(a, v, names) for _, v in assigns):
                names.add(name)
    return names


def _random(a, expr, names) -> bool:
    """Does this expression depend on a process-global random draw (or a name holding one)?"""
    for node in _walk(expr):
        if isinstance(node, cst.Name) and node.value in names:
            return True
        if isinstance(node, cst.Call):
            if any(arg.keyword is not None and arg.keyword.value == "generator" for arg in node.args):
                continue  # a generator of the script's own: it may be seeded alike on every rank
            q = a.resolver.qualify(node.func) or ""
            if _RANDOM.match(q) or (isinstance(node.func, cst.Attribute) and node.func.attr.value in _RANDOM_METHODS):
                return True
    return False


def _walk(node):
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children)


def _decides(a, test, names) -> bool:
    """Does a random draw decide this test during training? An `or`/`and` whose other operand is not the
    train/eval switch (`synced_gpus`, `is_fsdp_managed_module(self)`) may force the unit to run: unknown."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _decides(a, test.expression, names)
    if isinstance(test, cst.BooleanOperation):
        sides = (test.left, test.right)
        return any(_decides(a, x, names) for x in sides) and all(
            _decides(a, x, names) or "training" in a.code(x) for x in sides)
    return _random(a, test, names)


def _random_condition(a, call, loop):
    """The test that decides, by a random draw, whether the call runs in this loop iteration."""
    names = _random_names(a, call.scope)
    for g in call.guards:
        test = getattr(g.node, "test", None)
        if test is not None and _inside(g.node, loop.node) and _decides(a, test, names):
            return test
    # `if <draw>: continue` earlier in the loop body
    body = getattr(loop.node.body, "body", ())
    for stmt in body:
        if _contains(stmt, call.node):
            break
        if isinstance(stmt, cst.If) and _decides(a, stmt.test, names) and _ends_iteration(stmt.body):
            return stmt.test
    return None


def _inside(node, outer) -> bool:
    return node is not outer and _contains(outer, node)


def _contains(outer, node) -> bool:
    return any(n is node for n in _walk(outer))


def _ends_iteration(block) -> bool:
    stmts = getattr(block, "body", ())
    for st in stmts:
        small = getattr(st, "body", ()) if isinstance(st, cst.SimpleStatementLine) else ()
        if any(isinstance(x, (cst.Continue, cst.Break)) for x in small):
            return True
    return False


def _units_of(a, klass, attr):
    """The wrap call that makes each element of `self.<attr>` an FSDP unit: in the class (`self.layers =
    ModuleList([fsdp_wrap(Layer()) ...])`, `self.layers.append(FSDP(layer))`), or a per-element wrap elsewhere
    in the file (`for block in model.layers: fully_shard(block)`)."""
    wraps = [c for c in a.c.calls if _is_wrapper(c)]
    if not wraps:
        return None
    for scope in {id(c.scope): c.scope for c in a.c.calls if c.scope.klass == klass}.values():
        exprs = [s.value for s in scope.attr_sets if s.target == f"self.{attr}"]
        exprs += [arg.value for c in scope.calls if c.func in (f"self.{attr}.append", f"self.{attr}.extend")
                  for arg in c.node.args]
        for _ in range(2):  # `layers = [fsdp_wrap(...) ...]; self.layers = nn.ModuleList(layers)`
            exprs += [v for e in list(exprs) for n in _walk(e) if isinstance(n, cst.Name)
                      for _, v in scope.assigns.get(n.value, ()) if v is not e]
        for w in wraps:
            if any(_contains(e, w.node) for e in exprs):
                return w
    for w in wraps:
        target = w.arg(0, "module")
        name = dotted(target) if target is not None else None
        for loop in w.loops:
            if name and name in _loop_names(loop):
                d = dotted(_strip_iter(loop.iter))
                if d and d.split(".")[-1] == attr:
                    return w
    return None


def _strip_iter(it):
    for _ in range(3):
        if isinstance(it, cst.Call) and it.args and dotted(it.func) in ("enumerate", "list", "reversed"):
            it = it.args[0].value
        elif isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute) and it.func.attr.value in (
                "children", "values", "items"):
            it = it.func.value
    return it
