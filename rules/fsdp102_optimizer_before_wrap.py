import re

import libcst as cst

from fsdplint.analysis import UNKNOWN
from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import InsertLinesAfter, RemoveStatement, contains, unsafe
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid

# accelerate#2177 (first released in 0.25.0) removed `Accelerator._prepare_fsdp`, which had re-created an optimizer
# passed to `prepare` together with its model from the FSDP-wrapped model's parameters.
ACCELERATE_DROPPED_FSDP_REBUILD = "0.25.0"
_YAML_FSDP1_FLAT = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n  fsdp_use_orig_params: false\n"


class OptimizerBeforeWrap(Rule):
    code = "FSDP102"
    name = "optimizer-before-wrap"
    severity = Severity.ERROR
    sides = "SR"
    fix = Applicability.UNSAFE
    summary = (
        "optimizer built from the model's params before FSDP1 wrapping (use_orig_params=False), also through "
        "one accelerator.prepare(model, optimizer) call on accelerate >= 0.25"
    )
    doc = """
    ## What it does
    Finds an optimizer built from a model's parameters before the model is wrapped with
    `FullyShardedDataParallel` (with `use_orig_params=False`, the default) or sharded with `fully_shard`,
    and never rebuilt afterwards; under an accelerate FSDP2 launch config, a model prepared in an
    `accelerator.prepare` call without its optimizer; and, under an accelerate FSDP1 launch with
    `fsdp_use_orig_params: false`, an optimizer built before one `accelerator.prepare(model, optimizer)` call
    when the target accelerate is 0.25.0 or newer.

    ## Why is this bad?
    FSDP shards in place and replaces the parameters: FSDP1 flattens them into `FlatParameter`s, FSDP2
    swaps every parameter for a new sharded `DTensor` parameter. An optimizer built earlier still holds the
    old tensors: they never receive gradients, `optimizer.step()` updates nothing the model uses, and the
    loss does not move. Nothing raises.

    ## Example
    ```python
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model = FSDP(model, auto_wrap_policy=policy)
    ```

    ## Use instead
    ```python
    model = FSDP(model, auto_wrap_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ```
    With accelerate and FSDP2, pass both to one call: `model, optimizer = accelerator.prepare(model, optimizer)`
    (accelerate >= 1.6 maps the optimizer onto the sharded parameters). With accelerate and FSDP1, one call is
    enough only with `fsdp_use_orig_params: true` (the default of `accelerate launch` since 0.25.0): FSDP1
    then keeps the original parameter objects. With `fsdp_use_orig_params: false`, accelerate >= 0.25.0 hands
    the optimizer back untouched, so prepare the model first and build the optimizer from it:
    ```python
    model = accelerator.prepare(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    optimizer = accelerator.prepare(optimizer)
    ```

    ## Fix safety
    Unsafe: the fix moves the optimizer statement after the last wrap when both are statements of one
    block. Code in between that used the optimizer (a scheduler, a checkpoint load) must move too.

    ## Versions
    All versions of torch. The accelerate FSDP2 check follows accelerate's own `prepare` (1.15). The
    accelerate FSDP1 check: up to 0.24.1, `prepare(model, optimizer)` re-created the optimizer from the
    wrapped model's parameters (`Accelerator._prepare_fsdp`, with the warning "it is efficient and
    recommended to call prepare for the model before creating the optimizer"); accelerate#2177 removed it
    and made `use_orig_params=True` the launch default, first released in 0.25.0. Read in the accelerate
    sources of 0.24.1, 0.25.0, 1.0.0, 1.6.0, 1.14.0 and 1.15.0: from 0.25.0 nothing maps an FSDP1 optimizer
    onto FlatParameters (only XLA and, from 1.6.0, FSDP2 are remapped), so the stall of accelerate#2665 and
    #3256 is present in every release since.

    ## References
    - PyTorch FSDP docs (torch 2.0 fsdp.html): "the optimizer must be initialized after the module has been
      wrapped with FSDP"
    - accelerate docs usage_guides/fsdp.md; accelerate src accelerator.py
    - princeton-nlp/LESS#4
    - accelerate#2665 ("FSDP Model not learning during training, loss stays constant"), accelerate#3256
      ("Model Training Stalls with FSDP when `fsdp_use_orig_params=False`"), accelerate#2177 (removal of
      `_prepare_fsdp`), pytorch#107843
    """
    references = ("https://pytorch.org/docs/2.0/fsdp.html", "princeton-nlp/LESS#4", "accelerate#2665", "accelerate#3256",
                  "accelerate#2177")

    VALID = [
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, auto_wrap_policy=policy)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        """,
        # One accelerator.prepare call rebinds the optimizer to the wrapped model's parameters.
        """
        import torch
        from accelerate import Accelerator
        accelerator = Accelerator()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, optimizer = accelerator.prepare(model, optimizer)
        """,
        # Param groups rebound after fully_shard.
        """
        import torch.optim as optim
        import torch.distributed.fsdp as f
        optimizer = optim.AdamW(model.parameters(), lr=1e-4)
        for layer in model.layers:
            f.fully_shard(layer)
        f.fully_shard(model)
        optimizer.param_groups[0]["params"] = list(model.parameters())
        """,
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model = FSDP(model, use_orig_params=True)
        """,
        # Rebuilt after wrapping: the first optimizer is never used.
        """
        import torch
        from torch.distributed._composable.fsdp import fully_shard
        optimizer = torch.optim.AdamW(model.parameters())
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters())
        """,
        Valid(
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"},
        ),
        # FSDP1 with use_orig_params: true (accelerate's launch default): the original parameters survive.
        Valid(
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            options={"accelerate_config": _YAML_FSDP1_FLAT.replace("false", "true")},
        ),
        # accelerate <= 0.24 re-created the optimizer from the wrapped model inside prepare.
        Valid(
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            target={"accelerate": "0.24.1"},
            options={"accelerate_config": _YAML_FSDP1_FLAT},
        ),
        # use_orig_params: false, model prepared first, optimizer built from the wrapped model.
        Valid(
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator()
            model = accelerator.prepare(model)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            optimizer = accelerator.prepare(optimizer)
            """,
            options={"accelerate_config": _YAML_FSDP1_FLAT},
        ),
        # The same method called after the wrap: FSDP1 forwards it to the wrapped model, whose parameters
        # are then the flat ones.
        """
        import torch
        from torch import nn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        class Net(nn.Module):
            def optimizer(self, lr):
                return torch.optim.AdamW(self.parameters(), lr=lr)

        def main():
            net = Net()
            net = FSDP(net)
            opt = net.optimizer(1e-3)
        """,
        # A receiver that may hold two different classes: which method runs cannot be told.
        """
        import torch
        from torch import nn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        class A(nn.Module):
            def optimizer(self):
                return torch.optim.AdamW(self.parameters())

        class B(nn.Module):
            def optimizer(self):
                return None

        def main(big):
            net = A() if big else B()
            opt = net.optimizer()
            net = FSDP(net)
        """,
        # Another model's optimizer.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        d_opt = torch.optim.Adam(discriminator.parameters())
        model = FSDP(model)
        """,
    ]
    INVALID = [
        # The optimizer is built by a method of the model's class (decay / no-decay param groups), called on
        # the model a helper built, before the wrap.
        Invalid(
            """
            import torch
            from torch import nn
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            class Net(nn.Module):
                def optimizer(self, lr):
                    named = {n: p for n, p in self.named_parameters()}
                    named = {n: p for n, p in named.items() if p.requires_grad}
                    groups = [{"params": [p for p in named.values() if p.dim() > 1]},
                              {"params": [p for p in named.values() if p.dim() <= 1], "weight_decay": 0.0}]
                    return torch.optim.AdamW(groups, lr=lr)

            def build():
                return Net()

            def main():
                net = build()
                net = net.cuda()
                opt = net.optimizer(1e-3)
                net = FSDP(net)
            """,
            line=11,
        ),
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            model = FSDP(model, auto_wrap_policy=policy)
            scheduler = get_scheduler(optimizer)
            """,
            line=3,
            expected_fix="""
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, auto_wrap_policy=policy)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            scheduler = get_scheduler(optimizer)
            """,
        ),
        Invalid(
            """
            import bitsandbytes as bnb
            import torch.distributed.fsdp as f
            from peft import get_peft_model as add_lora

            def main(model, cfg):
                model = add_lora(model, cfg)
                opt = bnb.optim.AdamW8bit([p for p in model.parameters() if p.requires_grad])
                for layer in model.base_model.model.model.layers:
                    f.fully_shard(layer)
                f.fully_shard(model)
                train(model, opt)
            """,
            line=7,
            expected_fix="""
            import bitsandbytes as bnb
            import torch.distributed.fsdp as f
            from peft import get_peft_model as add_lora

            def main(model, cfg):
                model = add_lora(model, cfg)
                for layer in model.base_model.model.model.layers:
                    f.fully_shard(layer)
                f.fully_shard(model)
                opt = bnb.optim.AdamW8bit([p for p in model.parameters() if p.requires_grad])
                train(model, opt)
            """,
        ),
        Invalid(
            """
            from torch.optim import SGD
            from torch.distributed.fsdp import FullyShardedDataParallel

            class Runner:
                def build_optimizer(self):
                    self.optimizer = SGD(self.model.parameters(), lr=0.1)

                def setup(self):
                    self.build_optimizer()
                    self.model = FullyShardedDataParallel(self.model, use_orig_params=False)
            """,
            line=6,
        ),
        Invalid(
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            model = accelerator.prepare(model)
            optimizer = accelerator.prepare(optimizer)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"},
            line=5,
        ),
        # accelerate#3256: one prepare call, FSDP1 with use_orig_params: false, accelerate >= 0.25.
        Invalid(
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
            """,
            target={"accelerate": "1.1.1"},
            options={"accelerate_config": _YAML_FSDP1_FLAT},
            line=4,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        launch = getattr(a, "launch", None)
        fsdp2_launch = launch is not None and launch.fsdp_version == 2
        for t in a.timelines:
            for opt in t.of("optimizer"):
                if opt.entity is None:
                    continue
                if fsdp2_launch:
                    _check_separate_prepare(ctx, t, opt)
                if _prepared_together(t, opt):
                    _check_prepared_fsdp1(ctx, launch, opt)
                    continue
                wraps = [w for w in t.after(opt, ("wrap1", "shard2")) if _replaces_params(a, w)]
                if not wraps or t.after(wraps[0], ("optimizer",)):
                    continue
                if wraps[0].kind == "shard2" and _param_groups_rebound(ctx, t, opt, wraps[-1]):
                    continue
                w = wraps[0]
                if w.kind == "wrap1":
                    what = ("FullyShardedDataParallel (line {line}) with use_orig_params=False replaces them with "
                            "flattened FlatParameters")
                else:
                    what = "fully_shard (line {line}) replaces every one of them with a new sharded DTensor parameter"
                ctx.report(
                    opt.node,
                    "The optimizer is built from the model's parameters before the model is wrapped: "
                    + what.format(line=ctx.line(w.node))
                    + ", so the optimizer steps stale tensors that never get gradients and the model does not "
                    "train. Build the optimizer after wrapping, from the wrapped model's parameters.",
                    fix=_move_fix(ctx, opt, [x for x in wraps if x.step.prefix == opt.step.prefix]),
                )


def _check_prepared_fsdp1(ctx, launch, opt) -> None:
    """`model, optimizer = accelerator.prepare(model, optimizer)` under an FSDP1 launch with
    `use_orig_params: false`: accelerate >= 0.25 no longer rebuilds the optimizer (accelerate#2177 removed
    `_prepare_fsdp`), so it keeps the pre-wrap parameters."""
    if launch is None or launch.fsdp_version != 1:
        return
    setting = launch.get("use_orig_params")
    if setting is None or str(setting.value).strip().lower() not in ("false", "0", "no"):
        return
    av = ctx.version("accelerate")
    if av < ACCELERATE_DROPPED_FSDP_REBUILD:
        return
    where = f" (line {setting.line} of {setting.filename})" if setting.filename else ""
    ctx.report(
        opt.node,
        "The optimizer is built from the model's parameters before accelerator.prepare wraps the model with FSDP1 "
        f"and use_orig_params=False{where}: FSDP1 then replaces those parameters with flattened FlatParameters, "
        f"and {av.describe()} passes the optimizer through unchanged (accelerate stopped rebuilding it in 0.25.0), "
        "so optimizer.step() updates stale tensors and the loss does not move (accelerate#2665, #3256). Set "
        "fsdp_use_orig_params: true, or prepare the model first and build the optimizer from the prepared "
        "model's parameters.",
    )


def _check_separate_prepare(ctx, t, opt) -> None:
    """accelerate FSDP2: the model prepared in a call without its optimizer."""
    keys = {t.find(opt.step.key(n)) for n in _opt_names(opt)}
    if not keys:
        return
    for p in t.of("prepare", opt.entity):
        if not any(q.entity in keys for q in t.events if q.kind == "prepare" and q.step is p.step):
            ctx.report(
                p.call.node,
                "With FSDP2 (launch config fsdp_version: 2) accelerate needs the model and its optimizer in one "
                "prepare call, to point the optimizer at the sharded parameters; this call prepares the model "
                "alone and raises \"ValueError: When using FSDP2, a model and optimizer must be passed together "
                "to `Accelerator.prepare()`\". Use `model, optimizer = accelerator.prepare(model, optimizer)`.",
            )
            return


def _replaces_params(a, w) -> bool:
    """fully_shard always does; FSDP1 unless `use_orig_params=True` (or we cannot tell)."""
    if w.kind == "shard2":
        return True
    kws = a.keywords(w.call)
    if kws is None:
        return False
    expr = kws.get("use_orig_params")
    value = a.value(expr, w.call.scope) if expr is not None else False
    return value is False and value is not UNKNOWN


def _opt_names(opt) -> list[str]:
    return [d for d in (dotted(tg) for tg in (opt.call.targets if opt.call else [])) if d]


def _prepared_together(t, opt) -> bool:
    """`model, optimizer = accelerator.prepare(model, optimizer)`: accelerate rebinds the optimizer."""
    keys = {t.find(opt.step.key(n)) for n in _opt_names(opt)}
    for p in t.after(opt, ("prepare",), entity=opt.entity):
        if any(q.entity in keys for q in t.events if q.kind == "prepare" and q.step is p.step):
            return True
    return False


def _param_groups_rebound(ctx, t, opt, last_wrap) -> bool:
    """The code touches `optimizer.param_groups` / `add_param_group` after sharding."""
    names = _opt_names(opt)
    if not names:
        return False
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\.(param_groups|add_param_group)\b")
    start = ctx.line(last_wrap.node)
    if any(pattern.search(line) for line in ctx.source.splitlines()[start:]):
        return True
    for step in t.steps[last_wrap.step.order + 1:]:
        stmt = getattr(step.item, "stmt", None)
        if stmt is not None and pattern.search(ctx.code(stmt.node)):
            return True
    return False


def _move_fix(ctx, opt, wraps):
    """Move `opt = Optimizer(...)` after the statement holding the last wrap, when both sit in one block."""
    oc = opt.call
    if oc is None or oc.stmt is None or not wraps or not isinstance(oc.stmt.node, cst.SimpleStatementLine):
        return None
    if len(oc.stmt.node.body) != 1 or not _opt_names(opt):
        return None
    body = list(getattr(oc.stmt.block, "body", ()))
    target = max((i for i, st in enumerate(body) for w in wraps if contains(st, w.node)), default=None)
    if target is None or target <= oc.stmt.index:
        return None
    # FSDP1 must rebind the name the optimizer reads its parameters from (`model = FSDP(model)`).
    params_root = opt.ref.key.rsplit(":", 1)[-1] if opt.ref else None
    for w in wraps:
        if w.kind == "wrap1" and params_root not in [dotted(tg) for tg in w.call.targets]:
            return None
    between = "\n".join(ctx.code(st) for st in body[oc.stmt.index + 1: target + 1])
    if any(re.search(rf"\b{re.escape(n)}\b", between) for n in _opt_names(opt)):
        return None
    return unsafe("Build the optimizer after wrapping", RemoveStatement(oc.stmt.node),
                  InsertLinesAfter(body[target], ctx.code(oc.stmt.node).strip()))
