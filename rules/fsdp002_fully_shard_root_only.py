import re

import libcst as cst

from fsdplint.audit.examples import spec
from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import InsertLinesAfter, RemoveStatement, contains, unsafe
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid



class FullyShardRootOnly(Rule):
    code = "FSDP002"
    name = "fully-shard-root-only"
    severity = Severity.WARNING
    summary = "FSDP2 applied only to the root, or root before children: one giant unit, no memory saving"
    sides = "SA"
    fix = Applicability.UNSAFE
    versions = {"torch": ">=2.4"}
    doc = """
    ## What it does
    Finds FSDP2 plans where `fully_shard` is applied only to the root module (or to the root before its
    children), so one FSDP unit holds every parameter.

    ## Why is this bad?
    FSDP2 all-gathers a whole unit for its forward and backward. With a single unit every rank
    materializes the full model at once: no memory saving over DDP, and no overlap of communication with
    compute. `fully_shard`'s docstring says to call it bottom-up and "should *not* call fully_shard only on
    the topmost root".

    ## Example
    ```python
    fully_shard(model)
    ```

    ## Use instead
    ```python
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    ```

    ## Fix safety
    When the root call comes before the per-layer calls in the same block, the fix moves it after them
    (unsafe: code in between that used the sharded root now sees an unsharded one). Adding per-layer calls
    to a root-only script is left to you: which modules to shard depends on the architecture.

    ## Versions
    torch >= 2.4 (FSDP2).

    ## References
    - torch `_fully_shard.py` docstring; torchtitan docs/fsdp.md
    """
    VALID = [
        # transformers shards every block itself inside from_pretrained (its FSDP plan), not only the root.
        """
        from transformers import AutoModelForCausalLM
        from transformers.distributed import DistributedConfig
        model = AutoModelForCausalLM.from_pretrained("org/m", distributed_config=DistributedConfig(fsdp_size=8))
        """,
        """
        from torch.distributed.fsdp import fully_shard
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        """,
        """
        import torch.distributed.fsdp as f
        from peft import get_peft_model as add_lora
        model = add_lora(model, cfg)
        for name, block in model.base_model.model.model.layers.named_children():
            f.fully_shard(block, mesh=mesh)
        f.fully_shard(model, mesh=mesh)
        """,
        """
        from torch.distributed._composable.fsdp import fully_shard
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def apply_fsdp(model, mesh):
            for layer_id, block in model.layers.items():
                fully_shard(block, mesh=mesh, reshard_after_forward=int(layer_id) < len(model.layers) - 1)
            fully_shard([model.tok_embeddings, model.norm, model.output], mesh=mesh)
            fully_shard(model, mesh=mesh)
            return model
        """,
        # Per-layer sharding done by a helper of another module: unknown, so silent.
        """
        from torch.distributed.fsdp import fully_shard
        from mylib.parallel import shard_blocks
        shard_blocks(model)
        fully_shard(model)
        """,
        """
        from torch.distributed.fsdp import fully_shard
        for module in model.modules():
            if isinstance(module, DecoderLayer):
                fully_shard(module)
        fully_shard(model)
        """,
    ]
    VALID += [
        # A small block sharded whole in a unit test, not a model (torchtune's test_dora.py).
        """
        from torch.distributed._composable.fsdp import fully_shard
        with torch.device("meta"):
            ffn = FeedForward(gate_proj=linears[0], down_proj=linears[1], up_proj=linears[2])
        fully_shard(ffn)
        """,
        # One helper inlined at two call sites: its per-layer calls are not "after" the other site's root call.
        """
        from torch.distributed.fsdp import fully_shard

        def shard(model):
            for layer in model.layers:
                fully_shard(layer)
            fully_shard(model)

        def main(model, use_lora):
            if use_lora:
                shard(model)
            else:
                shard(model)
        """,
        Valid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            options={"accelerate_config": (
                "distributed_type: FSDP\n"
                "fsdp_config:\n"
                "  fsdp_version: 2\n"
                "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
            )},
        ),
    ]
    INVALID = [
        Invalid(
            """
            from torch.distributed.fsdp import fully_shard
            from peft import get_peft_model
            model = get_peft_model(model, cfg)
            fully_shard(model)
            """,
            line=4,
        ),
        Invalid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            options={"accelerate_config": (
                "distributed_type: FSDP\n"
                "fsdp_config:\n"
                "  fsdp_version: 2\n"
                "  fsdp_auto_wrap_policy: NO_WRAP\n"
            )},
            line=4,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as f

            def main(model):
                model.to("cuda")
                f.fully_shard(model, reshard_after_forward=False)
                return model
            """,
            line=5,
        ),
        Invalid(
            """
            from torch.distributed._composable.fsdp import fully_shard as shard
            shard(model)
            for layer in model.model.layers:
                shard(layer)
            optimizer = make_optimizer(model)
            """,
            line=2,
            expected_fix="""
            from torch.distributed._composable.fsdp import fully_shard as shard
            for layer in model.model.layers:
                shard(layer)
            shard(model)
            optimizer = make_optimizer(model)
            """,
        ),
    ]

    AUDIT_VALID = [spec()]
    AUDIT_INVALID = [spec(fsdp={"wrap": []}), spec(fsdp={"wrap": ["NoSuchDecoderLayer"]})]

    def check(self, ctx) -> None:
        a = ctx.analysis
        setting = _launch_no_wrap(a)
        if setting is not None:
            ctx.report_setting(
                setting,
                "The FSDP2 launch config sets auto_wrap_policy NO_WRAP: accelerate shards no transformer block, "
                "so the root unit holds all layers and each rank all-gathers them together for forward and "
                "backward. Use TRANSFORMER_BASED_WRAP so each decoder layer is its own unit.",
            )
        shard_calls = a.calls("fully_shard")
        # "Only the root" needs every fully_shard call of the file to shard one and the same model:
        # calls on other names may be submodules we cannot trace (`embed = model.get_input_embeddings()`).
        root_calls, root_entities = set(), set()
        for t in a.timelines:
            for e in t.of("shard2"):
                if e.ref is not None and not e.ref.child and e.entity is not None:
                    root_calls.add(id(e.call.node))
                    root_entities.add(e.entity)
        root_only_possible = len(root_entities) == 1 and all(id(c.node) in root_calls for c in shard_calls)
        for t in a.timelines:
            for ent in dict.fromkeys(e.entity for e in t.of("shard2") if e.entity is not None):
                # A library that shards inside a call (from_pretrained(distributed_config=...)) applies its
                # own per-block plan: only the script's own fully_shard calls are judged.
                events = [e for e in t.of("shard2", ent) if e.ref is not None and not e.data.get("implicit")]
                roots = [e for e in events if not e.ref.child]
                if not roots:
                    continue
                root = roots[0]
                # A helper inlined at several call sites repeats its calls: a per-layer call that already
                # ran before the root is not "after" it.
                earlier = {id(e.call.node) for e in events if e.ref.child and e.seq < root.seq}
                children = [e for e in events if e.ref.child and e.seq > root.seq and id(e.call.node) not in earlier]
                if children:
                    last = children[-1]
                    ctx.report(
                        root.node,
                        f"fully_shard is applied to the model before its submodules (line {ctx.line(last.node)}): "
                        "the root call already manages every parameter, so the model stays one FSDP unit that is "
                        "all-gathered whole (torch 2.13 even fails on the later call with \"TypeError: Invariant "
                        "encountered\"). Shard the transformer blocks first, the root last.",
                        fix=_move_after(ctx, root, last),
                    )
                elif root_only_possible and not any(e.ref.child for e in events):
                    if t.escapes(ent, root) or not _is_whole_model(a, t, ent):
                        continue
                    ctx.report(
                        root.node,
                        "fully_shard is applied only to the root model: FSDP2 puts every parameter in one unit, "
                        "so each rank all-gathers the whole model for forward and backward and sharding saves no "
                        "memory. Call fully_shard on each transformer block first (for layer in "
                        "model.model.layers: fully_shard(layer)), then on the root.",
                    )

    def audit(self, ctx):
        plan = ctx.plan
        if plan.version != 2 or len(plan.units) != 1 or plan.units[0].name != "":
            return
        why = (f"the wrap classes {plan.wrap_unmatched} match no module of {ctx.built.architecture}"
               if plan.wrap_unmatched else "no module below the root was sharded")
        ctx.report(self, f"fully_shard was applied only to the root ({why}): one FSDP unit holds all "
                         f"{plan.units[0].numel:,} parameters, so every rank all-gathers the whole model in "
                         f"forward and backward. Apply fully_shard to each "
                         f"{' / '.join(ctx.built.no_split_modules) or 'transformer block'} first, then the root.",
                   field="fsdp.wrap")


def _is_whole_model(a, t, ent) -> bool:
    """The sharded object is a model (named so, or loaded with from_pretrained), not some block built in a test."""
    names = {k.rsplit(":", 1)[-1] for k in t.uf.parent if t.find(k) == ent}
    if any("model" in n.lower() for n in names):
        return True
    loaded = {dotted(tg) for c in a.calls("load_model") for tg in c.targets}
    return bool(names & loaded)


def _move_after(ctx, root, last):
    """Move the root `fully_shard(model)` statement after the statement holding the last per-layer call."""
    rc, lc = root.call, last.call
    if rc is None or lc is None or rc.stmt is None or lc.stmt is None or root.step.prefix != last.step.prefix:
        return None
    if not isinstance(rc.stmt.node, cst.SimpleStatementLine) or len(rc.stmt.node.body) != 1:
        return None
    block = rc.stmt.block
    body = list(getattr(block, "body", ()))
    target = next((i for i, st in enumerate(body) if contains(st, lc.node)), None)
    if target is None or target <= rc.stmt.index:
        return None
    # The root call's result must not be used by the statements it is moved past.
    names = [dotted(tg) for tg in rc.targets]
    between = "\n".join(ctx.code(st) for st in body[rc.stmt.index + 1 : target + 1])
    if any(n is None or re.search(rf"\b{re.escape(n)}\b", between) for n in names):
        return None
    text = ctx.code(rc.stmt.node).strip()
    return unsafe("Apply fully_shard to the root after its submodules",
                  RemoveStatement(rc.stmt.node), InsertLinesAfter(body[target], text))




def _launch_no_wrap(a):
    """The FSDP2 launch config's `auto_wrap_policy: NO_WRAP` setting, if nothing else wraps."""
    launch = getattr(a, "launch", None)
    if launch is None or launch.fsdp_version != 2:
        return None
    s = launch.get("auto_wrap_policy")
    if s is None or str(s.value).strip().upper() != "NO_WRAP":
        return None
    if launch.value("transformer_layer_cls_to_wrap") or launch.value("min_num_params"):
        return None
    return s
