import re
from typing import Optional

import libcst as cst

from fsdplint.analysis import UNKNOWN
from fsdplint.apis import api_of
from fsdplint.analysis.lightning import (
    SHARDED_HOOK, lightning_fsdp, lightning_module_classes, lookup_project, parameter_roots, use_orig_params,
)
from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import InsertLinesAfter, RemoveStatement, contains, unsafe
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._unread import unread_names

# Unread functions that may build the optimizer again after the wrap (`build_optimizer(model)`, `setup_optim`).
MAY_REBUILD = re.compile(r"optim", re.I)
# Calls that build one (left-out project code that makes none cannot rebuild it).
BUILDS_OPTIMIZER = re.compile(r"optim|adam|sgd|lion|adafactor", re.I)

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
    when the target accelerate is 0.25.0 or newer. Under Lightning's FSDPStrategy (`Fabric(strategy=...)`,
    `Trainer(strategy=...)`, a registry name such as `"fsdp"` or 1.x's `"fsdp_native"`): an optimizer built
    before `fabric.setup_module(model)` / passed with it to `fabric.setup(model, optimizer)`, and a
    LightningModule's `configure_optimizers` that builds it from the module's own parameters (`self.parameters()`,
    `self.model.parameters()`, a submodule's method) instead of `self.trainer.model.parameters()` — when the
    strategy runs FSDP1 with `use_orig_params=False`: written, or Lightning < 2.1's default.

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
    Lightning: 2.1.0 made `FSDPStrategy` pass `use_orig_params=True` on torch >= 2.0 (read in Lightning 2.0.0,
    2.0.9 and 2.1.0 `fabric/strategies/fsdp.py` and `pytorch/strategies/fsdp.py`); before it Fabric's
    `setup_optimizers` and the Trainer raise "The optimizer does not seem to reference any FSDP parameters",
    and Fabric 2.0 refuses `setup(model, optimizer)`. With an unknown Lightning version an optimizer built
    before `setup_module` is a warning; `configure_optimizers` over `self.parameters()` and a joint
    `fabric.setup(model, optimizer)` — Lightning's own patterns from 2.1 — are reported only on a known
    version (`fsdplint/behaviour.py`, `lightning_fsdp_use_orig_params`).

    ## References
    - PyTorch FSDP docs (torch 2.0 fsdp.html): "the optimizer must be initialized after the module has been
      wrapped with FSDP"
    - accelerate docs usage_guides/fsdp.md; accelerate src accelerator.py
    - princeton-nlp/LESS#4
    - rasbt/cvpr2023#10, Lightning-Universe/lightning-GPT#17, Lightning-AI/pytorch-lightning#17309
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
        # Lightning calls configure_optimizers after wrapping; the wrapped model's parameters are the right ones.
        Valid(
            """
            import torch
            import lightning.pytorch as pl

            class Module(pl.LightningModule):
                def configure_optimizers(self):
                    return torch.optim.AdamW(self.trainer.model.parameters(), lr=1e-4)

            pl.Trainer(strategy="fsdp").fit(Module())
            """,
            target={"lightning": "2.0.9"},
        ),
        # Lightning >= 2.1 passes use_orig_params=True: the module's own parameters survive the wrap.
        Valid(
            """
            import torch
            import pytorch_lightning as pl
            from pytorch_lightning.strategies import FSDPStrategy

            class Module(pl.LightningModule):
                def configure_optimizers(self):
                    return torch.optim.AdamW(self.parameters(), lr=1e-4)

            pl.Trainer(strategy=FSDPStrategy(auto_wrap_policy={Block})).fit(Module())
            """,
            target={"lightning": "2.2.0", "torch": "2.2"},
        ),
        # Fabric: the module set up first, the optimizer built from it.
        Valid(
            """
            import torch
            from lightning.fabric import Fabric

            fabric = Fabric(strategy="fsdp")
            model = fabric.setup_module(model)
            optimizer = fabric.setup_optimizers(torch.optim.Adam(model.parameters()))
            """,
            target={"lightning": "2.0.0"},
        ),
        Valid(
            """
            import torch
            import lightning as L

            fabric = L.Fabric(strategy="fsdp")
            optimizer = torch.optim.Adam(model.parameters())
            model, optimizer = fabric.setup(model, optimizer)
            """,
            target={"lightning": "2.3.0", "torch": "2.3"},
        ),
        # An unknown Lightning version: Lightning's own pattern is right from 2.1 on (and 2.0 refuses it at
        # once), so neither configure_optimizers over self.parameters() nor a joint setup is reported.
        Valid(
            """
            import torch
            import lightning as L

            class Module(L.LightningModule):
                def configure_optimizers(self):
                    return torch.optim.AdamW(self.parameters(), lr=1e-4)

            L.Trainer(strategy="fsdp").fit(Module())
            fabric = L.Fabric(strategy="fsdp")
            optimizer = torch.optim.Adam(model.parameters())
            model, optimizer = fabric.setup(model, optimizer)
            """,
        ),
        # Not FSDP: the optimizer order does not matter under DDP.
        Valid(
            """
            import torch
            import lightning as L

            fabric = L.Fabric(strategy="ddp")
            optimizer = torch.optim.Adam(model.parameters())
            model = fabric.setup_module(model)
            """,
            target={"lightning": "2.0.0"},
        ),
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
        # Fabric 2.0 leaves use_orig_params False: setup_optimizers raises for an optimizer built before setup_module.
        Invalid(
            """
            import torch
            from lightning_fabric import Fabric

            fabric = Fabric(devices=4, strategy="fsdp")
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model = fabric.setup_module(model)
            optimizer = fabric.setup_optimizers(optimizer)
            """,
            target={"lightning": "2.0.5"},
            line=5,
        ),
        # Written use_orig_params=False, whatever the Lightning version.
        Invalid(
            """
            import torch
            import lightning as L
            from lightning.fabric.strategies import FSDPStrategy as Sharded

            def run(model):
                fabric = L.Fabric(strategy=Sharded(use_orig_params=False))
                opt = torch.optim.AdamW(model.parameters())
                model, opt = fabric.setup(model, opt)
            """,
            line=7,
        ),
        # Lightning 1.x "fsdp_native": configure_optimizers over the module's own parameters, through a submodule.
        Invalid(
            """
            import torch
            import pytorch_lightning as pl

            class Net(torch.nn.Module):
                def make_optimizer(self, lr):
                    return torch.optim.AdamW(self.parameters(), lr=lr)

            class Module(pl.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.net = Net()

                def configure_optimizers(self):
                    return self.net.make_optimizer(1e-4)

            pl.Trainer(strategy="fsdp_native").fit(Module())
            """,
            line=14,
        ),
        # Fabric with an unknown Lightning version: a warning that asks for the version.
        Invalid(
            """
            import torch
            import lightning as L

            fabric = L.Fabric(strategy="fsdp")
            optimizer = torch.optim.Adam(model.parameters())
            model = fabric.setup_module(model)
            """,
            line=5,
            severity="warning",
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        launch = getattr(a, "launch", None)
        fsdp2_launch = launch is not None and launch.fsdp_version == 2
        strategies = lightning_fsdp(a, ctx)
        if strategies:
            _check_lightning_module(ctx, [s for s in strategies if s.kind == "trainer"])
        fabrics = [s for s in strategies if s.kind == "fabric"]
        for t in a.timelines:
            for opt in t.of("optimizer"):
                if opt.entity is None:
                    continue
                if fabrics:
                    _check_fabric_setup(ctx, t, opt, fabrics)
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
                unseen = a.unseen_after(t, w, MAY_REBUILD, effect=BUILDS_OPTIMIZER)
                if unseen:
                    # "Never rebuilt afterwards" holds only if no unread code after the wrap rebuilds it.
                    names = unread_names(ctx, unseen)
                    ctx.report(opt.node, (
                        "The optimizer is built from the model's parameters before the model is wrapped (line "
                        f"{ctx.line(w.node)}), and the code of {names}, run after the wrap, was not read and may "
                        "build it again. If nothing does, the optimizer steps stale tensors and the model does not "
                        "train: build the optimizer after wrapping."), severity=Severity.WARNING)
                    continue
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


def _lightning_orig_params(ctx, strategies) -> tuple[Optional[bool], str]:
    """What the strategies hand FSDP1 as use_orig_params: False only when every one does; None (unknown)
    unless one passes True."""
    got = [use_orig_params(ctx.analysis, ctx, s) for s in strategies]
    if any(v is True for v, _ in got):
        return True, ""
    unknown = [why for v, why in got if v is None]
    if unknown:
        return None, unknown[0]
    return False, got[0][1]


def _report_lightning(ctx, node, uop, why, what: str, when_unknown: bool = True) -> None:
    """`when_unknown`: report (a warning) when the Lightning version cannot tell use_orig_params."""
    severity = None
    tail = f" ({why}.)"
    if uop is None:
        if not when_unknown and not ctx.strict_versions:
            return
        # Only as sure as the Lightning version: a warning, unless `strict-versions = true`.
        lv = ctx.version("lightning")
        severity = None if ctx.strict_versions else Severity.WARNING
        if not lv.known:
            tail = f" ({why}: {lv.declare_hint('2.1')}.)"
        elif lv.version.is_prerelease:
            tail = f" ({why}: a development build of 2.1.0 may be on either side of the change.)"
    ctx.report(
        node,
        f"{what} FSDP1 flattens them into FlatParameters when Lightning's FSDPStrategy runs with "
        f"use_orig_params=False, so Lightning raises \"ValueError: The optimizer does not seem to reference any "
        f"FSDP parameters\" (or, with some wrapped layers, the optimizer steps only part of the model). Build "
        f"the optimizer from the wrapped model's parameters, or run Lightning >= 2.1 without "
        f"use_orig_params=False." + tail,
        severity=severity,
    )


def _check_fabric_setup(ctx, t, opt, fabrics) -> None:
    """Fabric: an optimizer over the module's parameters, built before `fabric.setup_module(model)` /
    passed with it to `fabric.setup(model, optimizer)`."""
    setups = t.after(opt, ("lightning_setup",))
    if not setups or t.after(setups[0], ("optimizer",)):
        return
    uop, why = _lightning_orig_params(ctx, fabrics)
    if uop is True:
        return
    s = setups[0]
    joint = s.data.get("method") == "setup" and bool(s.data.get("optimizers"))
    how = (f"passed with it to fabric.setup (line {ctx.line(s.node)})" if joint else
           f"then set up with fabric.{s.data.get('method')} (line {ctx.line(s.node)})")
    # A joint setup is Fabric's documented pattern from 2.1 (and 2.0 refuses it at once): only when known.
    _report_lightning(ctx, opt.node, uop, why,
                      f"The optimizer is built from the model's parameters before Fabric wraps the model ({how}):",
                      when_unknown=not joint)


def _check_lightning_module(ctx, trainers) -> None:
    """Trainer: a LightningModule's configure_optimizers builds the optimizer from its own (unwrapped)
    parameters — `self.parameters()`, `self.model.parameters()`, or a submodule's method that does —
    instead of `self.trainer.model.parameters()`. Lightning calls the hook after wrapping the module."""
    if not trainers:
        return
    a = ctx.analysis
    uop = None
    for klass in lightning_module_classes(a):
        if (klass, SHARDED_HOOK) in a.c.methods:
            continue  # the module wraps its own layers; Lightning leaves the root unwrapped (1.x, 2.x)
        hook = a.c.methods.get((klass, "configure_optimizers"))
        if hook is None:
            continue
        for node, roots, where in _hook_optimizers(ctx, klass, hook):
            if not _own_parameters(roots):
                continue
            if uop is None:
                uop = _lightning_orig_params(ctx, trainers)
            if uop[0] is True:
                return
            _report_module_optimizer(ctx, node, uop, where)
    # A LightningModule of another module of the project, built here (`trainer.fit(Module())`).
    for call, roots, where in _foreign_module_optimizers(ctx):
        if not _own_parameters(roots):
            continue
        if uop is None:
            uop = _lightning_orig_params(ctx, trainers)
        if uop[0] is True:
            return
        _report_module_optimizer(ctx, call.node, uop, where)


def _own_parameters(roots) -> bool:
    """Parameters read from the LightningModule itself (`self`, `self.model`), none from `self.trainer.model`."""
    return bool(roots) and not any(r.startswith("self.trainer") for r in roots) and all(
        r == "self" or r.startswith("self.") for r in roots)


def _report_module_optimizer(ctx, node, uop, where) -> None:
    _report_lightning(ctx, node, uop[0], uop[1],
                      "configure_optimizers builds the optimizer from the LightningModule's own parameters "
                      f"{where}(not self.trainer.model.parameters()), and Lightning calls it after wrapping "
                      "the module:", when_unknown=False)


def _foreign_module_optimizers(ctx):
    """(the call in this file that builds the module, parameter roots, where the optimizer is built) for
    LightningModule classes of other modules of the project that this file instantiates."""
    a = ctx.analysis
    found_project = lookup_project(ctx)
    if found_project is None:
        return
    project, path = found_project
    seen: set = set()
    for call in a.c.calls:
        f = call.func
        if not f or "." in f or call.api is not None or f in a.c.class_bases or f in seen:
            continue
        seen.add(f)
        try:
            found = project.resolve(path, a._imports(None), f"{f}.configure_optimizers")
            fm = project.module(found[0], found[1]) if found is not None else None
        except (OSError, RecursionError):
            continue
        if fm is None:
            continue
        klass = found[1].split(".", 1)[0]
        c = fm.collector
        if (klass, SHARDED_HOOK) in c.methods or not _derives_lightning_module(c, klass):
            continue
        hook = c.methods.get((klass, "configure_optimizers"))
        for inner in (hook.calls if hook is not None else ()):
            if inner.api == "optimizer":
                where = f"(in {fm.display}:{fm.positions.range(inner.node)[0].row}) "
                yield call, parameter_roots(None, inner.arg(0, "params"), inner.scope), where


def _derives_lightning_module(c, klass: str) -> bool:
    for base in c.class_bases.get(klass, ()):
        try:
            q = c.resolver.qualify(cst.parse_expression(base))
        except Exception:  # noqa: BLE001 - an odd base expression: not a library class
            continue
        if api_of(q) == "lightning_LightningModule":
            return True
    return False


def _hook_optimizers(ctx, klass, hook):
    """(node to report, parameter roots, where it is built) for each optimizer the hook builds: in the hook, or
    in a method of a submodule it delegates to (`return self.gpt.configure_optimizers(...)`), whose own
    parameters are part of the LightningModule's."""
    a = ctx.analysis
    for call in hook.calls:
        if call.api == "optimizer":
            yield call.node, parameter_roots(a, call.arg(0, "params"), call.scope), ""
            continue
        f = call.func or ""
        parts = f.split(".")
        if len(parts) != 3 or parts[0] != "self":
            continue
        target = _submodule_method(ctx, klass, parts[1], parts[2])
        if target is None:
            continue
        scope, fm = target
        for inner in scope.calls:
            if inner.api == "optimizer":
                if fm is None:
                    roots = parameter_roots(a, inner.arg(0, "params"), inner.scope)
                    where = f"(through {parts[2]}(), line {ctx.line(inner.node)}) "
                else:
                    roots = parameter_roots(None, inner.arg(0, "params"), inner.scope)
                    where = f"(through {parts[2]}(), {fm.display}:{fm.positions.range(inner.node)[0].row}) "
                # The submodule's `self` is `self.<attr>` of the LightningModule.
                yield call.node, [f"self.{parts[1]}" + r[4:] if r.startswith("self") else r for r in roots], where


def _submodule_method(ctx, klass, attr, meth):
    """The method `meth` of the class `self.<attr>` is built from in `klass` (`self.gpt = GPT(...)`): in this
    file, or in another module of the project. (scope, the other module or None for this file)."""
    a = ctx.analysis
    ctor = None
    for (k, _), scope in a.c.methods.items():
        if k != klass:
            continue
        for st in scope.attr_sets:
            if st.target == f"self.{attr}" and isinstance(st.value, cst.Call):
                ctor = dotted(st.value.func)
    if not ctor or "." in ctor:
        return None
    local = a.c.methods.get((ctor, meth))
    if local is not None:
        return local, None
    found_project = lookup_project(ctx)
    if found_project is None:
        return None
    project, path = found_project
    try:
        found = project.resolve(path, a._imports(None), f"{ctor}.{meth}")
        if found is None:
            return None
        fm = project.module(*found)
        qual = found[1]
    except (OSError, RecursionError):
        return None
    if fm is None:
        return None
    scope = fm.collector.methods.get(tuple(qual.split(".", 1)))
    return (scope, fm) if scope is not None else None


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
