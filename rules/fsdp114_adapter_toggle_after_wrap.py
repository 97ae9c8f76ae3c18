import libcst as cst

from fsdplint.resolve import dotted

from fsdplint.behaviour import BEHAVIOURS
from fsdplint.collect import AttrSet
from fsdplint.facts import CITED, MEASURED, Fact
from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid

_NO_GRAD = ("no_grad", "inference_mode")


class AdapterToggleAfterWrap(Rule):
    code = "FSDP114"
    name = "adapter-toggle-after-wrap"
    severity = Severity.ERROR
    sides = "S"
    summary = (
        "`set_adapter(...)` or a by-name `requires_grad` flip on a model already wrapped by FSDP1 with "
        "use_orig_params=False (the FlatParameters keep the trainability they had at wrap time), or requires_grad "
        "changes inside the forward of a use_orig_params=True model (non-leaf views, or a second pass after the flip)"
    )
    versions = {"torch": ">=2.0"}
    doc = """
    ## What it does
    Finds, after a model was wrapped with `FullyShardedDataParallel(..., use_orig_params=False)` (the
    default; or prepared by accelerate under an FSDP1 launch with `fsdp_use_orig_params: false`):
    `model.set_adapter(name)` outside `torch.no_grad()`, and loops over `model.named_parameters()` that set
    `requires_grad` on the parameters whose name matches (`if "lora" in n: p.requires_grad = True`).

    Inside the `forward()` of a model wrapped with `FSDP(model, use_orig_params=True)` (a class of this file,
    or one of the classes the wrapped module is built from, in another module of the project):
    - no auto-wrap policy (one unit holds everything): `requires_grad` flips, and on peft < 0.19.0 peft's
      adapter toggles;
    - with an auto-wrap policy: a `requires_grad` change (`set_adapter`, `disable_adapter_layers`,
      `requires_grad_()`, a flip over `self.x.named_parameters()`) after a gradient-tracking pass through
      that submodule (`self.x(...)`) that is still in place when forward returns (no
      `enable_adapter_layers()` after it).

    ## Why is this bad?
    With `use_orig_params=False`, FSDP1 flattens each unit's parameters into one `FlatParameter`; its
    `requires_grad` is fixed when the model is wrapped, and the original parameters are no longer
    registered. After wrapping, `model.named_parameters()` yields only `..._flat_param` names, so a by-name
    loop matches nothing and silently changes nothing. `set_adapter("other")` makes peft call
    `requires_grad_()` on adapter modules that own no parameters any more: the adapter it switches to stays
    frozen, the active one gets no gradient, and the next backward raises `RuntimeError: element 0 of
    tensors does not require grad and does not have a grad_fn` (measured with torch 2.13, peft 0.21.2 on a
    small Llama, gloo on CPU; with `use_orig_params=True` and with FSDP2 the same code trains the new
    adapter).

    Inside `forward()` with `use_orig_params=True`, what breaks depends on where the toggled parameters sit
    (measured with torch 2.13, FSDP1 FULL_SHARD on 2 gloo ranks, a LoRA model, peft 0.15.2 and 0.21.2;
    `bench/facts/fsdp114_cpu_check.py` in fsdplint's repository):
    - In the unit whose forward is running (the whole model as one unit, or LoRA layers a policy left in
      the root unit): its parameters are views of the gathered FlatParameter, not leaves. The first flip
      raises `RuntimeError: you can only change requires_grad flags of leaf variables` (peft#2977, and
      peft#1442, whose traceback runs through FSDP's forward). peft 0.15.2's `disable_adapter()`,
      `set_adapter()` and `enable/disable_adapter_layers()` raise; peft 0.21.2's pass (they skip non-leaf
      tensors, peft#3001); a user's `p.requires_grad = ...` raises on both.
    - In nested units (a layer policy): their parameters are leaves while the outer forward runs, so a flip
      goes through. A flip before the passes, a `with model.disable_adapter():` pass, a disable that is
      enabled again before forward returns, and a pass under `torch.no_grad()` all train normally. But a
      flip after a gradient-tracking pass that is left in place (the encoder/decoder forward of peft#2977
      ends with `disable_adapter_layers()`) fails at backward with `AssertionError: Invalid:
      ``_post_backward_hook_state``` (FSDP1 registered the unit's post-backward hook for the FlatParameter's
      `requires_grad` at that pass and checks it against the current one in `_post_backward_hook`), on peft
      0.15.2 and 0.21.2 alike.

    Not reported, because measured harmless in every combination above (peft 0.15.2 and 0.21.2; FSDP1 with
    use_orig_params=True under one unit, a layer policy and peft's `fsdp_auto_wrap_policy`, and with
    use_orig_params=False under peft's policy, the one that can wrap a LoRA model then): toggles in
    the training step, outside `forward()` — `with model.disable_adapter():` reference passes,
    `disable_adapter_layers()` / `enable_adapter_layers()`, and `set_adapter` to a reference adapter and back
    under `torch.no_grad()`. They only switch which adapter the next forward uses. This is also how trl's
    DPOTrainer uses a PEFT model as its own reference (`ref_model=None`, `ref_adapter_name`: trl 0.15-0.20
    `null_ref_context`, trl 0.29+ `use_adapter`, both under `torch.no_grad()` outside the forward). peft#2692
    states that `disable_adapter()` outside forward raises on `FSDP(peft_model, use_orig_params=True)`; that
    did not reproduce with torch 2.13 (outside forward the sharded parameters are leaf `nn.Parameter`s).

    ## Example
    ```python
    model = get_peft_model(model, cfg)
    model.add_adapter("stage2", cfg2)
    model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model))
    ...
    model.set_adapter("stage2")   # stage2's FlatParameters were frozen at wrap time
    ```

    ## Use instead
    Choose the trainable adapter and set `requires_grad` before wrapping, or wrap with
    `use_orig_params=True` (measured: after `set_adapter("second")` the second adapter's gradients are
    reduced and equal on 2 gloo ranks), or use FSDP2 (`fully_shard`), where `requires_grad` is read again at
    every unshard (`FSDPParam.to_unsharded`). Toggle outside `forward()` (in the training step, before calling
    the wrapped model), and run a pass that needs no gradient under `torch.no_grad()`.

    ## Fix safety
    No automatic fix: moving the toggle before wrapping changes the training schedule.

    ## Versions
    Every torch with FSDP1. peft < 0.19.0 toggles (`set_adapter`, `enable/disable_adapter_layers`,
    `disable_adapter()`) call `requires_grad_()` on every adapter parameter; peft#3001 (0.19.0) skips
    non-leaf ones, so from 0.19.0 only the user's own flips inside a running unit's forward raise there. A
    flip left in place after a pass fails on every peft version measured (0.15.2, 0.21.2).

    ## References
    - peft#1442 (FSDP + `disable_adapter`), peft#2977 (`enable/disable_adapter_layers` under FSDP), peft#3001
    - torch src torch/distributed/fsdp/_flat_param.py, _fully_shard/_fsdp_param.py
    - trl src trainer/dpo_trainer.py (`null_ref_context`, `use_adapter`)
    """
    references = ("peft#1442", "peft#2977", "peft#3001")

    facts = (
        Fact("adapter toggles in the training step, outside forward (a disable_adapter() reference pass under "
             "no_grad; trl's set_adapter to a reference adapter and back) are harmless", "torch 2.13.0, peft 0.21.2",
             MEASURED, "2 gloo ranks: ok under one unit, a block policy and peft's layout with use_orig_params=True, "
             "and peft's layout with use_orig_params=False (the layouts that wrap)",
             "python bench/facts/fsdp114_cpu_check.py loop-disable dpo"),
        Fact("inside the wrapped forward: a requires_grad flip after a gradient-tracking pass left in place fails at "
             "backward; a user's p.requires_grad flip in the running unit raises", "torch 2.13.0, peft 0.21.2",
             MEASURED, "fwd:after-pass under a block policy: AssertionError: Invalid: ``_post_backward_hook_state``; "
             "fwd:userloop under one unit: 'you can only change requires_grad flags of leaf variables'",
             "python bench/facts/fsdp114_cpu_check.py"),
        Fact("disable_adapter() outside forward raises on FSDP(peft_model, use_orig_params=True)", "not reproduced",
             CITED, "peft#2692 states it; the loop-disable run above does not raise, so it is not reported"),
    )

    VALID = [
        # The DPO reference trick: the adapter is disabled for a no-grad forward.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, auto_wrap_policy=policy)
        with torch.no_grad(), model.disable_adapter():
            ref_logits = model(**batch).logits
        """,
        # Adapter chosen before wrapping.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model.set_adapter("stage2")
        for n, p in model.named_parameters():
            if "stage2" in n:
                p.requires_grad = True
        model = FSDP(model, auto_wrap_policy=policy)
        """,
        # use_orig_params=True keeps the original parameters.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
        model.set_adapter("stage2")
        """,
        # Freezing everything (no name filter inside the loop) reaches every FlatParameter too.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, auto_wrap_policy=policy)
        if args.freeze_all:
            for n, p in model.named_parameters():
                p.requires_grad = False
        """,
        # FSDP2 reads requires_grad at every unshard.
        """
        from torch.distributed.fsdp import fully_shard
        for layer in model.base_model.model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        model.set_adapter("stage2")
        for n, p in model.named_parameters():
            if "lm_head" in n:
                p.requires_grad = True
        """,
        # peft >= 0.19 toggles skip non-leaf parameters inside forward (peft#3001).
        Valid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            class Icae(torch.nn.Module):
                def forward(self, x):
                    self.lm.set_adapter("encoder")
                    out = self.lm(inputs_embeds=x)
                    self.lm.disable_adapter_layers()
                    return out

            model = FSDP(Icae(lm), use_orig_params=True)
            """,
            target={"peft": "0.19.0"},
        ),
        # A layer policy: the adapters live in sharded units of their own while the root's forward runs.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        class Wrapper(torch.nn.Module):
            def forward(self, x):
                for n, p in self.lm.named_parameters():
                    p.requires_grad = "lora" in n
                return self.lm(x)

        model = FSDP(Wrapper(lm), auto_wrap_policy=policy, use_orig_params=True)
        """,
        # set_adapter for a no-grad reference pass and back.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, auto_wrap_policy=policy)
        with torch.no_grad():
            model.set_adapter("ref")
            ref = model(**batch)
            model.set_adapter("default")
        """,
        # A layer policy; the pass that needs no gradient runs under no_grad, so only one pass tracks gradients.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        class Distill(torch.nn.Module):
            def forward(self, x):
                with torch.no_grad():
                    teacher = self.lm(inputs_embeds=x).logits
                self.lm.disable_adapter_layers()
                return self.lm(inputs_embeds=x).logits - teacher

        model = FSDP(Distill(lm), auto_wrap_policy=policy, use_orig_params=True)
        """,
        # Disabled for a second pass and enabled again before forward returns.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        class Contrast(torch.nn.Module):
            def forward(self, x):
                tuned = self.lm(inputs_embeds=x).logits
                self.lm.disable_adapter_layers()
                base = self.lm(inputs_embeds=x).logits
                self.lm.enable_adapter_layers()
                return tuned - base

        model = FSDP(Contrast(lm), auto_wrap_policy=policy, use_orig_params=True)
        """,
        # trl's DPOTrainer with the policy's own frozen adapter as the reference: it switches adapters under
        # torch.no_grad() outside the forward (behaviour.py trl_ref_adapter_under_no_grad).
        Valid(
            """
            from trl import DPOConfig, DPOTrainer
            args = DPOConfig("out", model_adapter_name="policy", ref_adapter_name="frozen_sft")
            trainer = DPOTrainer(model=peft_model, ref_model=None, args=args, train_dataset=pairs)
            trainer.train()
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"
                                          "  fsdp_use_orig_params: false\n"},
        ),
    ]
    INVALID = [
        # Adapters disabled after a gradient-tracking pass and left disabled when forward returns.
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            class ReadThenWrite(torch.nn.Module):
                def forward(self, x):
                    self.lm.set_adapter("reader")
                    notes = self.lm(inputs_embeds=x, output_hidden_states=True).hidden_states[-1]
                    self.lm.disable_adapter_layers()
                    return self.lm(inputs_embeds=notes)

            model = FSDP(ReadThenWrite(lm), auto_wrap_policy=policy, use_orig_params=True)
            """,
            target={"peft": "0.21.2"},
            line=8,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from peft.utils.other import fsdp_auto_wrap_policy
            model.add_adapter("stage2", cfg2)
            model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=False)
            train(model)
            model.set_adapter("stage2")
            train(model)
            """,
            line=6,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as fsdp

            def unfreeze_norms(model):
                for name, param in model.named_parameters():
                    if "norm" in name:
                        param.requires_grad = True

            def main(model):
                model = fsdp.FullyShardedDataParallel(model, auto_wrap_policy=policy)
                unfreeze_norms(model)
            """,
            line=6,
        ),
        Invalid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, opt = accelerator.prepare(model, opt)
            accelerator.unwrap_model(model).set_adapter("second")
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"
                                          "  fsdp_use_orig_params: false\n"},
            line=4,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, auto_wrap_policy=policy, use_orig_params=False)
            for n, p in model.named_parameters():
                p.requires_grad = "lora_" in n or "embed_tokens" in n
            """,
            line=4,
        ),
        # peft#2977: adapter switching inside the wrapped forward, one FSDP1 unit, peft < 0.19.
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            class Icae(torch.nn.Module):
                def forward(self, x):
                    self.lm.set_adapter("encoder")
                    out = self.lm(inputs_embeds=x)
                    self.lm.disable_adapter_layers()
                    return out

            model = FSDP(Icae(lm), use_orig_params=True, device_id=local_rank)
            """,
            target={"peft": "0.18.1"},
            line=6,
        ),
        # A manual flip inside forward raises on every peft version.
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            class Stage(torch.nn.Module):
                def forward(self, x):
                    for name, param in self.lm.named_parameters():
                        if "encadapt" in name:
                            param.requires_grad = False
                    return self.lm(x)

            model = FSDP(Stage(lm), use_orig_params=True)
            """,
            target={"peft": "0.21.2"},
            line=8,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        for t in a.timelines:
            flat = [w for w in t.of("wrap1") if _flat(a, w)] + _flat_prepares(a, t)
            if not flat:
                continue
            for step in t.steps:
                hit = _toggle(a, t, step)
                if hit is None:
                    continue
                entity, node, what = hit
                wraps = [w for w in flat if w.entity == entity and w.seq < step.order
                         and not t.exclusive(w, _Probe(step)) and not t.rebound(entity, w, _Probe(step, t))]
                if not wraps:
                    continue
                ctx.report(
                    node,
                    f"{what} on a model FSDP1 wrapped with use_orig_params=False (line {ctx.line(wraps[-1].node)}): its "
                    "parameters are now FlatParameters whose requires_grad was fixed at wrap time and whose names "
                    "are `..._flat_param`, so this changes nothing and the adapter meant to train stays frozen "
                    "(backward then raises \"element 0 of tensors does not require grad\"). Set the adapter and "
                    "requires_grad before wrapping, or wrap with use_orig_params=True, or use FSDP2.",
                )
        self._check_in_forward(ctx)

    def _check_in_forward(self, ctx) -> None:
        """Toggles inside `forward()` when one FSDP1 unit with use_orig_params=True holds every parameter: during
        that unit's forward its parameters are views of the gathered FlatParameter, not leaves. The forwards are
        this file's and those of the wrapped model's classes in other modules of the project."""
        a = ctx.analysis
        self._check_between_passes(ctx)
        single = [c for c in a.calls("FSDP1") if _single_unit_orig_params(a, c)]
        if not single:
            return
        old_peft = ctx.version("peft") < PEFT_LEAF_SAFE_TOGGLES
        own = [s for s in a.c.scopes if s.name == "forward" and s.klass is not None]
        foreign = [(c, s) for c, s in _wrapped_forwards(a, single[0]) if c is not a.c]
        for scope in own:
            self._scan_forward(ctx, scope, single[0], old_peft)
        for c, scope in foreign:
            self._scan_forward(ctx, scope, single[0], old_peft, where=_where(a, c, scope))

    def _check_between_passes(self, ctx) -> None:
        """FSDP1 with use_orig_params=True and an auto-wrap policy: inside the wrapped model's forward(), a
        requires_grad change after a gradient-tracking pass through a submodule, left in place. The nested units'
        parameters are leaves then, so the flip goes through, but the post-backward hook FSDP registered at that
        pass expects the requires_grad it saw, and backward fails."""
        a = ctx.analysis
        for wrap in a.calls("FSDP1"):
            kws = a.keywords(wrap)
            if kws is None or "auto_wrap_policy" not in kws or kws.get("use_orig_params") is None \
                    or a.value(kws["use_orig_params"], wrap.scope) is not True:
                continue
            for c, scope in _wrapped_forwards(a, wrap):
                hit = _flip_between_passes(scope)
                if hit is None:
                    continue
                node, attr, what = hit
                where = _where(a, c, scope)
                ctx.report(
                    node if c is a.c else wrap.node,
                    f"{what}{where} changes requires_grad after a pass through `{attr}` in forward() and leaves it changed, while "
                    f"FSDP1 with use_orig_params=True and an auto-wrap policy wraps the model (line "
                    f"{ctx.line(wrap.node)}): FSDP registered that pass's post-backward hooks for the requires_grad it "
                    "had, and backward then fails on parameters whose requires_grad changed (AssertionError: Invalid: "
                    "``_post_backward_hook_state``; measured with peft 0.15.2 and 0.21.2). Choose the adapters and "
                    "requires_grad in the training step, before calling the wrapped model, or run the pass that needs "
                    "no gradient under torch.no_grad().",
                )
                break

    def _scan_forward(self, ctx, scope, wrap, old_peft, where: str = "") -> None:
        foreign = bool(where)
        for call in scope.calls:
            if call.receiver is None:
                continue
            if call.method in _PEFT_TOGGLES and old_peft:
                what = f"{call.method}() (peft {ctx.version('peft').describe()} flips requires_grad on the adapters)"
            elif call.method == "requires_grad_":
                what = "requires_grad_()"
            else:
                continue
            self._report_in_forward(ctx, wrap.node if foreign else call.node, what + where, wrap)
        for item in scope.attr_sets:
            if item.target.endswith(".requires_grad") and item.key is None:
                self._report_in_forward(ctx, wrap.node if foreign else item.value, "Setting requires_grad" + where,
                                        wrap)

    def _report_in_forward(self, ctx, node, what, wrap) -> None:
        ctx.report(
            node,
            f"{what} inside forward(), while FSDP1 with use_orig_params=True wraps the whole model as one unit "
            f"(line {ctx.line(wrap.node)}): during that unit's forward its parameters are views of the gathered "
            "FlatParameter, not leaf tensors, and the first flip raises \"RuntimeError: you can only change "
            "requires_grad flags of leaf variables\" (peft#2977). Toggle outside forward(), wrap the layers as "
            "their own units (auto_wrap_policy), or use peft >= 0.19.0, whose toggles skip non-leaf parameters "
            "(peft#3001).",
        )


_PEFT_TOGGLES = ("set_adapter", "enable_adapter_layers", "disable_adapter_layers", "disable_adapter", "enable_adapters")
# peft#3001 (first released in 0.19.0): adapter toggles set requires_grad on leaf parameters only.
PEFT_LEAF_SAFE_TOGGLES = BEHAVIOURS["peft_leaf_safe_toggles"].since


def _wrapped_forwards(a, wrap) -> list:
    """(records of the defining file, forward scope) of the classes the FSDP1 call's module is built from:
    `FSDP(Wrapper(Model(...)))` or `model = Wrapper(Model(...)); FSDP(model)`, classes of this file or of other
    modules of the project (`from model import Model`)."""
    arg = wrap.arg(0, "module")
    d = dotted(arg) if arg is not None else None
    if d is not None and "." not in d:
        vals = [v for seq, v in wrap.scope.assigns.get(d, ()) if seq < wrap.seq]
        arg = vals[-1] if vals else None
    if not isinstance(arg, cst.Call):
        return []
    out, seen = [], set()

    class _Ctors(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            rec = a.call_at(node)
            found = a.project_class(rec) if rec is not None else None
            if found is not None and (id(found[0]), found[1]) not in seen:
                seen.add((id(found[0]), found[1]))
                fwd = found[0].methods.get((found[1], "forward"))
                if fwd is not None:
                    out.append((found[0], fwd))

    arg.visit(_Ctors())
    return out


def _where(a, c, scope) -> str:
    """` (in file.py, Class.forward)` for code of another module; empty for this file."""
    if c is a.c:
        return ""
    path = a.defined_in(c)
    return f" (in {path.name if path is not None else 'another module'}, {scope.klass}.forward)"


_FLIPS = ("set_adapter", "disable_adapter_layers", "requires_grad_")


def _flip_between_passes(scope):
    """(node, submodule, description) when, in `scope`, requires_grad changes after a gradient-tracking call of
    `self.X(...)` and is not put back before the method returns: the last adapter toggle after that pass is a
    disable/switch (not `enable_adapter_layers()`), or a single flip of the user's."""
    passes = [c for c in scope.calls if c.func and c.func.startswith("self.") and c.func.count(".") == 1
              and not any(isinstance(w, cst.Call) and (dotted(w.func) or "").endswith(_NO_GRAD) for w in c.withs)]
    flips = [(c.seq, c.node, f"{c.method}()", dotted(c.receiver), c.method) for c in scope.calls
             if c.method in _FLIPS + ("enable_adapter_layers",) and c.receiver is not None]
    for i in scope.attr_sets:
        it = i.loops[-1].iter if i.loops else None
        if i.target.endswith(".requires_grad") and i.key is None and isinstance(it, cst.Call) \
                and isinstance(it.func, cst.Attribute) and it.func.attr.value in ("parameters", "named_parameters"):
            flips.append((i.seq, i.value, "Setting requires_grad", dotted(it.func.value), "user"))
    flips.sort(key=lambda f: f[0])
    for first in passes:
        after = [f for f in flips if f[0] > first.seq and f[3] is not None
                 and (f[3] == first.func or f[3].startswith(first.func + "."))]
        if not after:
            continue
        seq, node, what, _, kind = after[-1]
        if kind == "enable_adapter_layers":
            continue  # put back
        if kind in ("user", "requires_grad_") and len(after) > 1:
            continue  # several flips of the user's: one may restore the other
        return node, first.func, what
    return None


def _single_unit_orig_params(a, call) -> bool:
    """`FSDP(model, use_orig_params=True)` with no auto-wrap policy: one unit holds every parameter."""
    kws = a.keywords(call)
    if kws is None or "auto_wrap_policy" in kws:
        return False
    expr = kws.get("use_orig_params")
    return expr is not None and a.value(expr, call.scope) is True


class _Probe:
    """Just enough of an Event for Timeline.exclusive / rebound."""

    def __init__(self, step, t=None):
        self.step, self.timeline = step, t

    @property
    def seq(self):
        return self.step.order

    @property
    def call(self):
        return self.step.call


def _flat(a, w) -> bool:
    if w.call is None or w.ref is None or w.ref.child:
        return False
    kws = a.keywords(w.call)
    if kws is None:
        return False
    expr = kws.get("use_orig_params")
    return expr is None or a.value(expr, w.call.scope) is False


def _flat_prepares(a, t) -> list:
    launch = getattr(a, "launch", None)
    if launch is None or launch.fsdp_version != 1:
        return []
    setting = launch.get("use_orig_params")
    if setting is None or str(setting.value).strip().lower() not in ("false", "0", "no"):
        return []
    return [p for p in t.of("prepare") if p.ref is not None and not p.ref.child]


def _toggle(a, t, step):
    """(entity, node, description) when the step changes which parameters train."""
    item = step.item
    call = step.call
    if call is not None and call.method == "set_adapter" and call.receiver is not None:
        if any(any(n in a.code(w) for n in _NO_GRAD) for w in a.enclosing_withs(step)):
            return None
        r = a.ref(call.receiver, step)
        if r is None:
            return None
        return t.find(r.key), call.node, "set_adapter()"
    if isinstance(item, AttrSet) and item.target.endswith(".requires_grad") and item.loops:
        loop = item.loops[-1]
        it = loop.iter
        if not (isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute)
                and it.func.attr.value == "named_parameters"):
            return None
        # By name: an `if` inside the loop, or `p.requires_grad = "lora" in n`.
        inner_if = any(g.loop_depth >= len(item.loops) for g in item.guards)
        if not inner_if and not _mentions(item.value, set(loop.target.split(",")) - {item.target.split(".")[0]}):
            return None
        r = a._loop_model(step, it)
        if r is None:
            return None
        return t.find(r.key), item.value, "Setting requires_grad by parameter name"
    return None


def _mentions(expr, names: set) -> bool:
    """Whether the expression reads one of these names (the loop's parameter-name variable)."""
    found = []

    class _V(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            if node.value in names:
                found.append(node)

    expr.visit(_V())
    return bool(found)
