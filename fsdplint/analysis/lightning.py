"""Lightning as the FSDP wrap: the strategy a `Trainer` / `Fabric` runs, the FSDP settings it passes to
`FullyShardedDataParallel`, and the LightningModule hooks Lightning calls around the wrap.

What Lightning does with those settings, by version, is data in fsdplint/behaviour.py (`lightning_*`):
the `use_orig_params` it passes, what the Trainer checkpoints, what `strategy="fsdp"` meant. Here only
the script is read: which host gets which strategy (a registry name, an `FSDPStrategy(...)`, or a
subclass of it defined in the file), and which of its keywords are set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import libcst as cst

from fsdplint.analysis.records import UNKNOWN
from fsdplint.apis import api_of
from fsdplint.collect import Call, Scope
from fsdplint.resolve import dotted

# Registry names of torch-FSDP strategies (Lightning 1.9.5 and 2.x register_strategies): Fabric's "fsdp",
# "fsdp_cpu_offload" (2.x), "fsdp_full_shard_offload" (lightning_fabric 1.9); the Trainer's "fsdp_native",
# "fsdp_native_full_shard_offload" (1.x, renamed "fsdp" / "fsdp_cpu_offload" in 2.0).
FSDP_STRATEGY_NAMES = frozenset({
    "fsdp", "fsdp_cpu_offload", "fsdp_full_shard_offload", "fsdp_native", "fsdp_native_full_shard_offload",
})
# Names only Lightning < 2.0 registered: a script that uses one runs Lightning 1.x.
LEGACY_NAMES = frozenset({"fsdp_native", "fsdp_native_full_shard_offload"})
# Hooks of a LightningModule: Lightning calls configure_optimizers after wrapping the module;
# configure_sharded_model (legacy) means the user wraps the layers and Lightning skips the root wrap.
SHARDED_HOOK = "configure_sharded_model"


@dataclass
class LightningFsdp:
    """One `Trainer(strategy=...)` / `Fabric(strategy=...)` that runs torch FSDP."""

    host: Call = field(repr=False)
    kind: str  # "trainer" or "fabric"
    strategy: Optional[Call] = field(default=None, repr=False)  # the FSDPStrategy(...) call (or of a subclass); None for a registry name
    name: Optional[str] = None  # the registry name, e.g. "fsdp"
    subclass: Optional[str] = None  # a subclass of FSDPStrategy defined in this file
    overrides: frozenset = field(default_factory=frozenset)  # methods that subclass defines

    @property
    def node(self) -> cst.CSTNode:
        """Where to report the strategy: its call, or the host's `strategy=` argument."""
        if self.strategy is not None:
            return self.strategy.node
        arg = self.host.kwarg("strategy")
        return arg if arg is not None else self.host.node

    def setting(self, a, key: str) -> Any:
        """The expression the strategy is given for `key` (None when absent, UNKNOWN behind **kwargs)."""
        return a.keyword(self.strategy, key) if self.strategy is not None else None

    @property
    def legacy(self) -> bool:
        return self.name in LEGACY_NAMES


def _qualify(a, name: str) -> Optional[str]:
    try:
        return a.resolver.qualify(cst.parse_expression(name))
    except Exception:  # noqa: BLE001 - a base written in a form the parser refuses: not a library class
        return None


def strategy_subclasses(a) -> dict[str, frozenset]:
    """Classes of this file deriving from a Lightning FSDPStrategy (directly or through another), with the
    methods each defines."""
    bases = getattr(a.c, "class_bases", {})
    out: dict[str, frozenset] = {}
    changed = True
    while changed:
        changed = False
        for klass, bs in bases.items():
            if klass in out:
                continue
            if any(b in out or api_of(_qualify(a, b)) == "lightning_FSDPStrategy" for b in bs):
                own = frozenset(m for (k, m) in a.c.methods if k == klass)
                inherited = frozenset().union(*(out.get(b, frozenset()) for b in bs))
                out[klass] = own | inherited
                changed = True
    return out


def lightning_module_classes(a) -> list[str]:
    """Classes of this file deriving from a LightningModule (directly or through another class of it)."""
    bases = getattr(a.c, "class_bases", {})
    out: list[str] = []
    changed = True
    while changed:
        changed = False
        for klass, bs in bases.items():
            if klass not in out and any(b in out or api_of(_qualify(a, b)) == "lightning_LightningModule" for b in bs):
                out.append(klass)
                changed = True
    return out


def _strategy_call(a, expr, scope: Scope, subclasses: dict) -> Optional[Call]:
    """The FSDPStrategy (or subclass) call `expr` evaluates to, through simple bindings and the branches
    that may assign it (`strategy = "auto"; if args.fsdp: strategy = FSDPStrategy(...)`)."""
    for _ in range(4):
        if isinstance(expr, cst.Call):
            call = a.call_at(expr)
            if call is None or id(call) in getattr(a, "_dead", ()):
                return None  # unknown, or in a branch the known argument values rule out
            if call.api == "lightning_FSDPStrategy" or (call.func in subclasses):
                return call
            return None
        if isinstance(expr, (cst.Name, cst.Attribute)):
            d = dotted(expr)
            if d is None:
                return None
            bound = a.binding(d, scope)
            if bound is None:
                for s in (scope, a.module_scope_of(scope)):
                    for _, v in (s.assigns.get(d, ()) if s is not None else ()):
                        hit = _strategy_call(a, v, scope, subclasses) if isinstance(v, cst.Call) else None
                        if hit is not None:
                            return hit
                return None
            expr = bound
            continue
        return None
    return None


def lightning_fsdp(a, ctx=None) -> list[LightningFsdp]:
    """Every Trainer / Fabric of the file whose strategy is torch FSDP. With `ctx`, the Trainer's
    strategy="fsdp" is dropped on Lightning < 2.0, where it named FairScale's strategy."""
    key = "_lightning_fsdp"
    cached = a.__dict__.get(key)
    if cached is None:
        cached = a.__dict__[key] = _find(a)
    if ctx is None:
        return cached
    from fsdplint import behaviour

    out = []
    for lf in cached:
        if lf.kind == "trainer" and lf.name == "fsdp" and behaviour.holds(
                "lightning_trainer_fsdp_is_torch", ctx.version("lightning")) is False:
            continue
        out.append(lf)
    return out


def _find(a) -> list[LightningFsdp]:
    subclasses = strategy_subclasses(a)
    out: list[LightningFsdp] = []
    for host in a.calls("lightning_Fabric", "lightning_Trainer"):
        kind = "fabric" if host.api == "lightning_Fabric" else "trainer"
        expr = host.kw("strategy")
        if expr is None:
            continue
        names = {v for v in a.values(expr, host.scope) if isinstance(v, str)}
        fsdp_names = sorted(names & FSDP_STRATEGY_NAMES)
        if fsdp_names:
            out.append(LightningFsdp(host, kind, name=fsdp_names[0]))
            continue
        call = _strategy_call(a, expr, host.scope, subclasses)
        if call is not None:
            sub = call.func if call.func in subclasses else None
            out.append(LightningFsdp(host, kind, strategy=call, subclass=sub,
                                     overrides=subclasses.get(sub, frozenset()) if sub else frozenset()))
    return out


def use_orig_params(a, ctx, lf: LightningFsdp) -> tuple[Optional[bool], str]:
    """The `use_orig_params` the strategy hands FSDP1 — True / False, None when it cannot be told — and why."""
    from fsdplint import behaviour

    expr = lf.setting(a, "use_orig_params")
    if expr is UNKNOWN:
        return None, "the strategy's keywords cannot be read"
    if expr is not None:
        v = a.value(expr, lf.strategy.scope)
        return (v, f"use_orig_params={v}") if isinstance(v, bool) else (None, "use_orig_params is not a constant")
    if lf.legacy:
        return False, (f"strategy=\"{lf.name}\" is Lightning < 2.0, which leaves use_orig_params to FSDP's "
                       f"default (False)")
    tv = ctx.version("torch")
    if tv.known and tv < "2.0":
        return False, f"Lightning sets use_orig_params=True only on torch >= 2.0 ({tv.describe()})"
    lv = ctx.version("lightning")
    held = behaviour.holds("lightning_fsdp_use_orig_params", lv)
    if held is None:
        return None, (f"Lightning passes use_orig_params=True from 2.1.0 and leaves it False before; "
                      f"{lv.describe()}")
    if held:
        return True, f"{lv.describe()} passes use_orig_params=True"
    return False, f"{lv.describe()} leaves use_orig_params to FSDP's default (False); 2.1.0 sets it True"


def is_fabric(a, expr: Optional[cst.BaseExpression]) -> bool:
    """A Fabric object: a name bound to `Fabric(...)`, or one that says so (`fabric`, `self.fabric`)."""
    d = dotted(expr) if expr is not None else None
    return d is not None and ("fabric" in d.lower() or a.bound_to(d, "lightning_Fabric"))


def parameter_roots(a, expr, scope: Scope, depth: int = 0) -> list[str]:
    """The objects whose `.parameters()` / `.named_parameters()` an optimizer's params come from, as written
    (`self`, `self.model`, `self.trainer.model`), following names bound in `scope`, comprehensions and
    param-group dicts. With `a` None (code of another module, which has no analysis here), a name is
    followed through that scope's own single assignment."""
    if expr is None or depth > 5:
        return []
    out: list[str] = []
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in (
                "parameters", "named_parameters"):
            d = dotted(node.func.value)
            if d is not None:
                out.append(d)
            continue
        if isinstance(node, cst.Attribute):
            continue  # `self.trainer.model` as a value: not a name to follow
        if isinstance(node, cst.Name):
            if a is not None:
                bound = a.binding(node.value, scope)
            else:
                vals = scope.assigns.get(node.value, ())
                bound = vals[0][1] if len(vals) == 1 else None
            if bound is not None and bound is not expr:
                out.extend(parameter_roots(a, bound, scope, depth + 1))
            continue
        stack.extend(node.children)
    return out


def lookup_project(ctx):
    """(project, this file's path) to look a class up in (`self.net = Net()` of another file): the file's own
    project, else the folder being linted when no project marker sits above the file; None without a file."""
    a = ctx.analysis
    if ctx.path is None:
        return None
    path = ctx.path.resolve()
    if getattr(a, "project", None) is not None:
        return a.project, path
    from fsdplint.analysis.index import project_for

    linted = ctx.options.get("project_root")
    project = project_for(path, use_cache=False, linted_dir=linted) if linted else None
    return (project, path) if project is not None else None
