"""Where a script turns on activation checkpointing, and how (shared by FSDP105, FSDP106, FSDP107, FSDP109).

Two different mechanisms carry the same name in user code:
- Hugging Face gradient checkpointing: `model.gradient_checkpointing_enable(...)` (or
  `activation_checkpointing_enable` in transformers 5), or `TrainingArguments(gradient_checkpointing=True)`.
  It wraps each decoder layer's forward in `torch.utils.checkpoint`, reentrant or not.
- FSDP activation checkpointing: `apply_activation_checkpointing(...)` / `checkpoint_wrapper`, or
  `activation_checkpointing` in an accelerate `fsdp_config` / `TrainingArguments(fsdp_config=...)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import libcst as cst

from fsdplint.analysis import UNKNOWN
from fsdplint.apis import BOUNDARIES
from fsdplint.collect import Call
from fsdplint.fixes import Replace, add_keyword, safe
from fsdplint.resolve import dotted

GC_METHODS = ("gradient_checkpointing_enable", "activation_checkpointing_enable")
# transformers switched its default to `use_reentrant=False` in transformers#43203 (released in v5).
NON_REENTRANT_DEFAULT_SINCE = BOUNDARIES["transformers_non_reentrant_default"].since  # read at 4.57.6 and 5.0.0


@dataclass
class HfCheckpointing:
    """One place that turns on Hugging Face gradient checkpointing."""

    node: cst.CSTNode  # where to report: the enabling call, or the `gradient_checkpointing=True` argument
    call: Call  # the call that takes the checkpointing kwargs (the method call or the TrainingArguments call)
    kwargs_name: str
    # True / False when written, None when left to the library default, UNKNOWN when unresolvable.
    use_reentrant: Any
    trl: bool  # set through a trl config (SFTConfig, ...), whose trainers prepare PEFT models themselves
    via_args: bool  # TrainingArguments rather than a direct method call
    # The method is the project's own (`model.gradient_checkpointing_enable = MethodType(f, model)` before the
    # call): "inputs" when that function makes the checkpointed inputs require grad itself, "unknown" when its
    # code is not readable, None when the library's method runs.
    replaced: Optional[str] = None

    def reentrant(self, ctx) -> tuple[bool, str]:
        """Whether checkpointing will be reentrant, and why (for the message); (False, "") when unknown."""
        if self.use_reentrant is True:
            return True, "use_reentrant=True is passed explicitly"
        if self.use_reentrant is None and not self.trl:
            tv = ctx.version("transformers")
            if tv < NON_REENTRANT_DEFAULT_SINCE:
                return True, f"{tv.describe()} defaults to reentrant checkpointing (use_reentrant=True)"
        return False, ""

    def fix(self, message: str = 'Pass gradient_checkpointing_kwargs={"use_reentrant": False}'):
        """Safe rewrite to non-reentrant checkpointing, when the kwargs are absent or a literal dict."""
        kw = self.call.kwarg(self.kwargs_name)
        if kw is None:
            if self.call.star_kwargs():
                return None
            new = add_keyword(self.call.node, self.kwargs_name, '{"use_reentrant": False}')
            return safe(message, Replace(self.call.node, new))
        if isinstance(kw.value, cst.Dict):
            for el in kw.value.elements:
                if (isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString)
                        and el.key.evaluated_value == "use_reentrant"):
                    if isinstance(el.value, cst.Name) and el.value.value == "True":
                        return safe(message, Replace(el.value, "False"))
                    return None
        return None


def _is_trl(call: Call) -> bool:
    return bool(call.qualname and call.qualname.startswith("trl."))


def _reentrant_of(a, call: Call, kwargs_name: str) -> Any:
    expr = a.keyword(call, kwargs_name)
    if expr is None:
        return None
    if expr is UNKNOWN:
        return UNKNOWN
    v = a.value(expr, call.scope)
    if v is None:
        return None
    if isinstance(v, dict):
        r = v.get("use_reentrant", None)
        return r if r in (True, False, None) else UNKNOWN
    return UNKNOWN


def _replaced_method(a, call: Call) -> Optional[str]:
    """Whether `recv.<method>(...)` runs a function the project bound to the object before the call
    (`recv.gradient_checkpointing_enable = MethodType(fn, recv)`, `= partial(fn, recv)`, `= fn`): then the
    library's defaults (reentrancy, input grads) are not what runs, the project's function is. "inputs" when
    that function (or a function defined in it) makes inputs require grad: `enable_input_require_grads()`,
    `x.requires_grad_(True)`, `x.requires_grad = True`; "unknown" when the function cannot be read."""
    recv = dotted(call.receiver) if call.receiver is not None else None
    if recv is None:
        return None
    target = f"{recv}.{call.method}"
    sets = [s for s in call.scope.attr_sets if s.target == target and s.key is None and s.seq < call.seq]
    if not sets:
        return None
    origin = getattr(a, "_origins", {}).get(id(call.scope))
    collector = origin.collector if origin is not None else a.c
    value, fn = sets[-1].value, None
    for _ in range(4):
        while isinstance(value, cst.Call) and value.args:  # MethodType(fn, obj), partial(fn, ...)
            value = value.args[0].value
        name = dotted(value)
        fn = collector.functions.get(name) if name else None
        if fn is not None or name is None or "." in name:
            break
        # `enable = partial(_enable, ...)`, then `MethodType(enable, model)`: the name's value.
        value = a.binding(name, call.scope)
        if value is None:
            break
    if fn is None:
        return "unknown"
    return "inputs" if _makes_inputs_require_grad(collector, fn) else None


def _makes_inputs_require_grad(collector, fn, depth: int = 0) -> bool:
    """The function, a function defined in it, or a function of the same module it calls (three deep)."""
    def inside(scope) -> bool:
        while scope is not None:
            if scope is fn:
                return True
            scope = collector.enclosing.get(id(scope))
        return False

    for c in collector.calls:
        if inside(c.scope) and depth < 3 and c.func in collector.functions and collector.functions[c.func] is not fn:
            if _makes_inputs_require_grad(collector, collector.functions[c.func], depth + 1):
                return True
    for c in collector.calls:
        if not inside(c.scope):
            continue
        if c.method == "enable_input_require_grads":
            return True
        if c.method == "requires_grad_":
            arg = c.arg(0, "requires_grad")
            if arg is None or (isinstance(arg, cst.Name) and arg.value == "True"):
                return True
    for scope in collector.scopes:
        if not inside(scope):
            continue
        for s in scope.attr_sets:
            if s.target.endswith(".requires_grad") and isinstance(s.value, cst.Name) and s.value.value == "True":
                return True
    return False


def hf_checkpointing(a) -> list[HfCheckpointing]:
    """Every place the script enables Hugging Face gradient checkpointing."""
    out: list[HfCheckpointing] = []
    for call in a.method_calls(*GC_METHODS):
        if call.receiver is None:
            continue
        kwname = "gradient_checkpointing_kwargs" if call.method == "gradient_checkpointing_enable" else "activation_checkpointing_kwargs"
        out.append(HfCheckpointing(call.node, call, kwname, _reentrant_of(a, call, kwname), False, False,
                                   _replaced_method(a, call)))
    for call in a.calls("TrainingArguments"):
        for flag, kwname in (("gradient_checkpointing", "gradient_checkpointing_kwargs"),
                             ("activation_checkpointing", "activation_checkpointing_kwargs")):
            expr = a.keyword(call, flag)
            if expr is None or expr is UNKNOWN or a.value(expr, call.scope) is not True:
                continue
            arg = call.kwarg(flag)
            out.append(HfCheckpointing(arg if arg is not None else call.node, call, kwname,
                                       _reentrant_of(a, call, kwname), _is_trl(call), True))
    return out


@dataclass
class FsdpCheckpointing:
    """FSDP activation checkpointing: a torch call in the script, or a launch-config setting."""

    node: Optional[cst.CSTNode]
    setting: Any = None  # launch.Setting when it comes from a config


def fsdp_checkpointing(a) -> list[FsdpCheckpointing]:
    out: list[FsdpCheckpointing] = []
    for ev in a.events("ac"):
        if a.fsdp_at(ev.call):
            out.append(FsdpCheckpointing(ev.node))
    launch = getattr(a, "launch", None)
    if launch is not None and launch.uses_fsdp:
        s = launch.get("activation_checkpointing")
        if s is not None and s.value is True:
            out.append(FsdpCheckpointing(s.node, s))
    # Lightning's FSDPStrategy(activation_checkpointing=... | activation_checkpointing_policy=...) applies
    # apply_activation_checkpointing to the wrapped model (fabric/strategies/fsdp.py _setup_activation_checkpointing).
    from fsdplint.analysis.lightning import lightning_fsdp

    for lf in lightning_fsdp(a):
        for key in ("activation_checkpointing_policy", "activation_checkpointing"):
            expr = lf.setting(a, key)
            if expr is None or expr is UNKNOWN or a.value(expr, lf.strategy.scope) is None:
                continue
            arg = lf.strategy.kwarg(key)
            out.append(FsdpCheckpointing(arg if arg is not None else lf.strategy.node))
            break
    return out


def trainer_calls(a) -> list[Call]:
    return a.calls("Trainer")


def uses_trl(a) -> bool:
    return any(_is_trl(c) for c in [*a.calls("Trainer"), *a.calls("TrainingArguments")])
