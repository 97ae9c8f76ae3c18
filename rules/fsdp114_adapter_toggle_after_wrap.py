import libcst as cst

from fsdplint.collect import AttrSet
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
        "use_orig_params=False (the FlatParameters keep the trainability they had at wrap time), or inside the "
        "forward of a use_orig_params=True unit (non-leaf views)"
    )
    versions = {"torch": ">=2.0"}
    doc = """
    ## What it does
    Finds, after a model was wrapped with `FullyShardedDataParallel(..., use_orig_params=False)` (the
    default; or prepared by accelerate under an FSDP1 launch with `fsdp_use_orig_params: false`):
    `model.set_adapter(name)` outside `torch.no_grad()`, and loops over `model.named_parameters()` that set
    `requires_grad` on the parameters whose name matches (`if "lora" in n: p.requires_grad = True`). Also
    `requires_grad` flips (and, on peft < 0.19.0, peft's adapter toggles) inside a module's `forward()` when
    `FSDP(model, use_orig_params=True)` wraps the whole model as one unit.

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

    Inside `forward()`, the other way round: with `use_orig_params=True` the parameters of the unit whose
    forward is running are views of the gathered FlatParameter, not leaves, so flipping their
    `requires_grad` raises `RuntimeError: you can only change requires_grad flags of leaf variables`
    (peft#2977). The rule reports it where it is certain: a `requires_grad` flip, or a peft adapter toggle
    on peft < 0.19.0, inside a `forward()` method of a script that wraps with `FSDP(model,
    use_orig_params=True)` and no auto-wrap policy (one unit holds everything). Measured: the flip raises
    when the toggled parameters sit in the running unit, and passes when a layer policy put them in
    sharded units of their own.

    Toggling adapters for a forward pass that needs no gradient is fine: `with model.disable_adapter():`,
    `disable_adapter_layers()` / `enable_adapter_layers()` and `set_adapter` under `torch.no_grad()` (the
    DPO/ORPO reference-model trick) only switch which adapter the forward uses — measured to give the base
    model's logits under FSDP1 (both settings) and FSDP2.

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
    the wrapped model).

    ## Fix safety
    No automatic fix: moving the toggle before wrapping changes the training schedule.

    ## Versions
    Every torch with FSDP1. peft < 0.19.0 toggles (`set_adapter`, `enable/disable_adapter_layers`,
    `disable_adapter()`) call `requires_grad_()` on every adapter parameter; peft#3001 (0.19.0) skips
    non-leaf ones, so from 0.19.0 only the user's own flips inside `forward()` raise.

    ## References
    - peft#1442 (FSDP + `disable_adapter`), peft#2977 (`enable/disable_adapter_layers` under FSDP), peft#3001
    - torch src torch/distributed/fsdp/_flat_param.py, _fully_shard/_fsdp_param.py
    """
    references = ("peft#1442", "peft#2977", "peft#3001")

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
    ]
    INVALID = [
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
        that unit's forward its parameters are views of the gathered FlatParameter, not leaves."""
        a = ctx.analysis
        single = [c for c in a.calls("FSDP1") if _single_unit_orig_params(a, c)]
        if not single:
            return
        old_peft = ctx.version("peft") < PEFT_LEAF_SAFE_TOGGLES
        for scope in a.c.scopes:
            if scope.name != "forward" or scope.klass is None:
                continue
            for call in scope.calls:
                if call.receiver is None:
                    continue
                if call.method in _PEFT_TOGGLES and old_peft:
                    what = f"{call.method}() (peft {ctx.version('peft').describe()} flips requires_grad on the adapters)"
                elif call.method == "requires_grad_":
                    what = "requires_grad_()"
                else:
                    continue
                self._report_in_forward(ctx, call.node, what, single[0])
            for item in scope.attr_sets:
                if item.target.endswith(".requires_grad") and item.key is None:
                    self._report_in_forward(ctx, item.value, "Setting requires_grad", single[0])

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
PEFT_LEAF_SAFE_TOGGLES = "0.19.0"


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
