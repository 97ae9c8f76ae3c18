"""The shared analysis of a training script: which objects hold the model, and what happens to them, in order.

Rules query this instead of re-matching syntax. Each entry-point scope (module
body, functions not called from elsewhere in the file) becomes a `Timeline`:
its calls in evaluation order, with calls to helper functions of the same file
inlined, and a union-find over names so `model = FSDP(model)`,
`peft_model = get_peft_model(model, cfg)` and `model.module` all denote one
model. When the analysis cannot tell, it records nothing and rules stay silent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, Iterator, Optional, Union

import libcst as cst

from fsdplint.apis import MODEL_LOADER_METHODS
from fsdplint.collect import AttrSet, Call, Collector, Scope, collect
from fsdplint.resolve import dotted

# Calls that return the model they were given (so their result is the same model).
SAME_MODEL_APIS = {
    "get_peft_model": (0, "model"),
    "FSDP1": (0, "module"),
    "fully_shard": (0, "module"),
    "DDP": (0, "module"),
    "prepare_model_for_kbit_training": (0, "model"),
    "PeftModel_from_pretrained": (0, "model"),
    "torch_compile": (0, "model"),
}
SAME_MODEL_METHODS = {"to", "cuda", "half", "bfloat16", "float", "requires_grad_", "train", "eval", "to_empty"}
# Attributes that reach the same model through a wrapper.
TRANSPARENT = {"module", "base_model", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}
# Roots whose first attribute names the object (`self.model`, `trainer.model`).
HOLDERS = {"self", "cls", "trainer", "state", "args", "accelerator", "engine", "ctx", "runner"}
MODEL_METHODS = {
    "gradient_checkpointing_enable", "add_adapter", "save_pretrained", "generate", "merge_and_unload",
    "merge_adapter", "print_trainable_parameters", "enable_input_require_grads", "get_input_embeddings",
}

# Calls that take the model but cannot wrap or shard its submodules (see `Timeline.escapes`).
_HARMLESS_METHODS = {
    "to", "cuda", "cpu", "train", "eval", "half", "bfloat16", "float", "to_empty", "parameters", "named_parameters",
    "modules", "named_modules", "children", "named_children", "buffers", "named_buffers", "requires_grad_",
    "print_trainable_parameters", "gradient_checkpointing_enable", "enable_input_require_grads",
    "get_input_embeddings", "get_output_embeddings", "resize_token_embeddings", "tie_weights", "state_dict",
    "load_state_dict", "num_parameters", "get_nb_trainable_parameters", "forward", "generate", "info", "debug",
    "warning", "print",
}
_HARMLESS_FUNCS = {"print", "len", "isinstance", "sum", "type", "str", "repr", "id", "hasattr", "getattr", "list"}

UNKNOWN: Any = type("Unknown", (), {"__repr__": lambda self: "UNKNOWN", "__bool__": lambda self: False})()


@dataclass(frozen=True)
class QName:
    """A dotted reference that is not a literal, e.g. `torch.bfloat16`."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Ref:
    key: str
    child: bool  # a submodule of the model (a layer), not the model itself
    path: tuple[str, ...] = ()


Item = Union[Call, AttrSet]


@dataclass
class Step:
    item: Item
    prefix: str
    mapping: dict[str, str]
    returns: list[str] = field(default_factory=list)  # keys returned by an inlined helper
    # Position in the timeline (execution order); `seq` is the source order, which differs for inlined helpers.
    order: int = -1

    @property
    def seq(self) -> int:
        return self.item.seq

    @property
    def call(self) -> Optional[Call]:
        return self.item if isinstance(self.item, Call) else None

    def key(self, name: str) -> str:
        if name in self.mapping:
            return self.mapping[name]
        root = name.split(".", 1)[0]
        if root in ("self", "cls"):
            return name
        return self.prefix + name


@dataclass
class Event:
    kind: str
    step: Step
    ref: Optional[Ref]
    data: dict = field(default_factory=dict)
    timeline: Optional["Timeline"] = None

    @property
    def call(self) -> Optional[Call]:
        return self.step.call

    @property
    def node(self) -> cst.CSTNode:
        return self.step.item.node if isinstance(self.step.item, Call) else self.step.item.value

    @property
    def seq(self) -> int:
        """Execution order within the timeline (a helper defined below its caller still runs at the call)."""
        return self.step.order if self.step.order >= 0 else self.step.seq

    @property
    def entity(self) -> Optional[str]:
        return self.timeline.find(self.ref.key) if (self.ref and self.timeline) else None


class UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, k: str) -> str:
        p = self.parent.setdefault(k, k)
        while p != self.parent.setdefault(p, p):
            p = self.parent[p]
        self.parent[k] = p
        return p

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


class Timeline:
    def __init__(self, analysis: "ScriptAnalysis", scope: Scope, steps: list[Step]) -> None:
        self.analysis = analysis
        self.scope = scope
        self.steps = steps
        for i, step in enumerate(steps):
            step.order = i
        self.uf = UnionFind()
        self.events: list[Event] = []
        self.model_keys: set[str] = set()

    def find(self, key: str) -> str:
        return self.uf.find(key)

    @cached_property
    def item_ids(self) -> frozenset:
        """ids of the calls and assignments this program runs (its entry function and inlined helpers)."""
        return frozenset(id(s.item) for s in self.steps)

    def of(self, kind: str, entity: Optional[str] = None) -> list[Event]:
        return [e for e in self.events if e.kind == kind and (entity is None or e.entity == entity)]

    def before(self, event: Event, kinds: Iterable[str], entity: Optional[str] = None) -> list[Event]:
        """Events of these kinds on the entity that can run before `event` (not in an exclusive branch,
        nor before the name was bound to a freshly loaded model on the way to `event`)."""
        kinds = set(kinds)
        ent = entity if entity is not None else event.entity
        return [e for e in self.events if e.seq < event.seq and e.kind in kinds and e.entity == ent
                and not self.exclusive(e, event) and not self.rebound(ent, e, event)]

    def after(self, event: Event, kinds: Iterable[str], entity: Optional[str] = None) -> list[Event]:
        """Events of these kinds on the entity that can run after `event` (as `before`)."""
        kinds = set(kinds)
        ent = entity if entity is not None else event.entity
        return [e for e in self.events if e.seq > event.seq and e.kind in kinds and e.entity == ent
                and not self.exclusive(e, event) and not self.rebound(ent, event, e)]

    def rebound(self, entity: Optional[str], first: Event, then: Event) -> bool:
        """Between the two events, the entity's name is bound to a freshly loaded model
        (`model = AutoModel.from_pretrained(...)`, perhaps with `.to(...)`) on every path to `then`:
        what happened before concerned another object."""
        if entity is None:
            return False
        guards = {id(g) for g in then.call.guards} if then.call is not None else set()
        for step in self._fresh_loads:
            if not first.seq < step.order < then.seq or step.prefix != then.step.prefix:
                continue
            if any(id(g) not in guards for g in step.item.guards):
                continue  # a conditional reload: the old object may still be the one used
            if any(self.find(step.key(d)) == entity for d in map(dotted, step.item.targets) if d):
                return True
        return False

    @cached_property
    def _fresh_loads(self) -> list[Step]:
        """Steps that bind a name to a newly loaded model: `load(...)`, `load(...).to(device)`, `.eval()`...
        A loader the resolver cannot name (`self.model_class.from_pretrained(...)`) builds a new object too."""
        out = []
        for step in self.steps:
            call = step.call
            while call is not None and step.call.targets:
                if call.api == "load_model" or (call.api is None and call.method in MODEL_LOADER_METHODS):
                    out.append(step)
                    break
                call = self.analysis.call_at(call.receiver) if isinstance(call.receiver, cst.Call) else None
        return out

    def exclusive(self, a: Event, b: Event) -> bool:
        """True when the two events sit in branches that never both run (`if x:` / `else:`, `elif`, ...)."""
        return self.analysis.exclusive(a.step, b.step)

    def escapes(self, entity: Optional[str], event: Event) -> bool:
        """True when, before `event`, the model reaches code the analysis cannot see.

        E.g. `shard_layers(model)` imported from another module, or `model.apply(fn)`: such code may
        wrap or shard submodules, so rules that need "nothing else happened" stay silent.
        """
        a = self.analysis
        for step in self.steps:
            if step.order >= event.step.order:
                break
            call = step.call
            if call is None or call.api is not None or call.func in a.c.functions or call.func in _HARMLESS_FUNCS:
                continue
            if call.receiver is not None and call.method in _HARMLESS_METHODS:
                continue
            exprs = [x.value for x in call.node.args] + ([call.receiver] if call.receiver is not None else [])
            for x in exprs:
                r = a.ref(x, step)
                if r is not None and self.find(r.key) == entity:
                    return True
        return False

    def is_model(self, entity: Optional[str]) -> bool:
        return entity is not None and any(self.find(k) == entity for k in self.model_keys)

    def wrap_state(self, entity: str, seq: int, at: Optional[Event] = None) -> Optional[str]:
        """"fsdp1", "fsdp2" or None: how the model is wrapped at `seq` (on the path of event `at`, if given:
        wraps in a branch that excludes it do not count)."""
        state = None
        for e in self.events:
            if e.seq >= seq:
                break
            if e.entity != entity or (at is not None and (self.exclusive(e, at) or self.rebound(entity, e, at))):
                continue
            if e.kind == "wrap1":
                state = "fsdp1"
            elif e.kind == "shard2":
                state = "fsdp2"
        return state


def _fsdp_version(call: Call) -> int:
    return 1 if call.api == "FSDP1" else 2


def _is_test(scope: Scope) -> bool:
    return scope.node is not None and scope.name.startswith("test")


class ScriptAnalysis:
    def __init__(self, module: cst.Module, collector: Optional[Collector] = None) -> None:
        self.module = module
        self.c = collector or collect(module)
        self.resolver = self.c.resolver
        self.timelines: list[Timeline] = []
        self._build()

    # -- facts over the whole file -------------------------------------------------
    def calls(self, *apis: str) -> list[Call]:
        return [c for c in self.c.calls if c.api in apis]

    def method_calls(self, *methods: str) -> list[Call]:
        return [c for c in self.c.calls if c.method in methods]

    @cached_property
    def uses_fsdp1(self) -> bool:
        return 1 in self.fsdp_at(None)

    @cached_property
    def uses_fsdp2(self) -> bool:
        return 2 in self.fsdp_at(None)

    @cached_property
    def uses_fsdp(self) -> bool:
        return bool(self.fsdp_at(None))

    def fsdp_at(self, call: Optional[Call], launch: bool = True) -> frozenset:
        """The FSDP versions the code at `call` (None: the script) runs under — 1, 2, or the launch
        config's own value — from the launch config and the script's FSDP calls.

        A test function (`test*`, as pytest and unittest collect them) is a program of its own: FSDP
        in one test says nothing about the code of another, nor about the code outside the tests. So
        code that runs only inside tests sees only its own tests' FSDP calls, and FSDP calls that run
        only inside tests do not count for the rest of the file. `launch=False`: the script's calls only."""
        out = frozenset() if self.launch_fsdp_version is None or not launch else frozenset({self.launch_fsdp_version})
        test_only, own = self._test_fsdp
        if call is None or id(call) not in test_only:
            return out | frozenset(_fsdp_version(c) for c in self.calls("FSDP1", "fully_shard") if id(c) not in test_only)
        return out | frozenset(v for ids, versions in own if id(call) in ids for v in versions)

    def fsdp1_at(self, call: Optional[Call]) -> bool:
        """FSDP1 reaches the code at `call`: an FSDP1 call, or an FSDP launch that is not FSDP2."""
        versions = self.fsdp_at(call)
        return 1 in versions or (bool(versions) and 2 not in versions)

    @cached_property
    def _test_fsdp(self) -> tuple[set[int], list[tuple[frozenset, frozenset]]]:
        """(ids of the calls that run only inside test functions, [(ids of a test's calls, its FSDP versions)])."""
        in_tests: set[int] = set()
        elsewhere: set[int] = set()
        own = []
        for t in self.timelines:
            if _is_test(t.scope):
                in_tests |= t.item_ids
                own.append((t.item_ids, frozenset(_fsdp_version(s.item) for s in t.steps
                                                  if isinstance(s.item, Call) and s.item.api in ("FSDP1", "fully_shard"))))
            else:
                elsewhere |= t.item_ids
        return in_tests - elsewhere, own

    @cached_property
    def uses_peft(self) -> bool:
        return bool(self.calls("get_peft_model", "inject_adapter_in_model", "PeftModel_from_pretrained", "LoraConfig")) or bool(
            self.method_calls("add_adapter")
        )

    # Filled from the launch configuration (accelerate YAML / TrainingArguments / plugin), see launch.py.
    launch: Any = None
    launch_fsdp_version: Optional[int] = None

    def events(self, kind: str) -> Iterator[Event]:
        for t in self.timelines:
            for e in t.events:
                if e.kind == kind:
                    yield e

    # -- value resolution ----------------------------------------------------------
    def value(self, expr: Optional[cst.BaseExpression], scope: Optional[Scope] = None, depth: int = 0) -> Any:
        """Literal value of an expression, `QName` for dotted references, else UNKNOWN."""
        if expr is None or depth > 6:
            return UNKNOWN
        if isinstance(expr, (cst.Integer, cst.Float)):
            return expr.evaluated_value
        if isinstance(expr, (cst.SimpleString, cst.ConcatenatedString)):
            v = expr.evaluated_value
            return v if v is not None else UNKNOWN
        if isinstance(expr, cst.Name):
            if expr.value in ("True", "False", "None"):
                return {"True": True, "False": False, "None": None}[expr.value]
            bound = self.binding(expr.value, scope)
            if bound is not None:
                return self.value(bound, scope, depth + 1)
            q = self.resolver.qualify(expr)
            return QName(q) if q else UNKNOWN
        if isinstance(expr, cst.Attribute):
            q = self.resolver.qualify(expr)
            if q:
                return QName(q)
            d = dotted(expr)
            bound = self.binding(d, scope) if d else None
            if bound is not None:
                return self.value(bound, scope, depth + 1)
            return UNKNOWN
        if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
            out = [self.value(e.value, scope, depth + 1) for e in expr.elements if not isinstance(e, cst.StarredElement)]
            return out if all(v is not UNKNOWN for v in out) else UNKNOWN
        if isinstance(expr, cst.Dict):
            d = {}
            for el in expr.elements:
                if not isinstance(el, cst.DictElement):
                    return UNKNOWN
                k = self.value(el.key, scope, depth + 1)
                if k is UNKNOWN or not isinstance(k, (str, int)):
                    return UNKNOWN
                d[k] = self.value(el.value, scope, depth + 1)
            return d
        if isinstance(expr, cst.Call) and dotted(expr.func) == "dict":
            return {a.keyword.value: self.value(a.value, scope, depth + 1) for a in expr.args if a.keyword is not None}
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            v = self.value(expr.expression, scope, depth + 1)
            return -v if isinstance(v, (int, float)) else UNKNOWN
        return UNKNOWN

    def binding(self, name: str, scope: Optional[Scope]) -> Optional[cst.BaseExpression]:
        """The single expression bound to `name` (in `scope`, else at module level), if unique."""
        for s in ([scope] if scope is not None else []) + [self.c.module_scope]:
            vals = s.assigns.get(name)
            if vals:
                return vals[0][1] if len(vals) == 1 else None
            if s is not self.c.module_scope and name in s.params:
                return None
        return None

    def call_for(self, expr: Optional[cst.BaseExpression], scope: Optional[Scope], api: str) -> Optional[Call]:
        """The `api(...)` call `expr` evaluates to, following simple name bindings."""
        for _ in range(4):
            if isinstance(expr, cst.Call):
                call = self.call_at(expr)
                return call if call is not None and call.api == api else None
            if isinstance(expr, (cst.Name, cst.Attribute)):
                d = dotted(expr)
                expr = self.binding(d, scope) if d else None
                continue
            return None
        return None

    def keywords(self, call: Call) -> Optional[dict[str, cst.BaseExpression]]:
        """Keyword arguments of a call, including `**name` dicts built in the same scope; None if one is unknown.

        `**name` resolves when `name` is bound once to a dict literal or `dict(...)`, plus any
        `name["key"] = value` in that scope before the call; `name.update(...)` makes it unknown.
        """
        out: dict[str, cst.BaseExpression] = {}
        for a in call.node.args:
            if a.star == "**":
                d = dotted(a.value)
                bound = self.binding(d, call.scope) if d else (a.value if isinstance(a.value, (cst.Dict, cst.Call)) else None)
                if isinstance(bound, cst.Dict):
                    for el in bound.elements:
                        key = self.value(el.key, call.scope) if isinstance(el, cst.DictElement) else UNKNOWN
                        if not isinstance(key, str):
                            return None
                        out[key] = el.value
                elif isinstance(bound, cst.Call) and dotted(bound.func) == "dict" and all(x.keyword for x in bound.args):
                    out.update({x.keyword.value: x.value for x in bound.args})
                else:
                    return None
                if any(c.method == "update" and dotted(c.receiver) == d for c in call.scope.calls):
                    return None
                for ds in call.scope.dict_sets:
                    if ds.target == d and ds.seq < call.seq:
                        if ds.key is None:
                            return None
                        out[ds.key] = ds.value
            elif a.keyword is not None:
                out[a.keyword.value] = a.value
        return out

    def call_at(self, node: Optional[cst.CSTNode]) -> Optional[Call]:
        """The recorded call whose node this is, if any."""
        return self.c._by_node.get(id(node))

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    # -- call-site context of inlined helpers ------------------------------------------
    @cached_property
    def _calls_by_seq(self) -> dict[int, Call]:
        return {c.seq: c for c in self.c.calls}

    def site_calls(self, step: Step) -> list[Call]:
        """The call itself, then the calls of same-file helpers it was inlined through (innermost first)."""
        import re

        out = [step.call] if step.call is not None else []
        for seq in reversed(re.findall(r"@(\d+):", step.prefix)):
            c = self._calls_by_seq.get(int(seq))
            if c is not None:
                out.append(c)
        return out

    # -- branches that exclude each other ------------------------------------------------
    def exclusive(self, a: Step, b: Step) -> bool:
        """True when `a` and `b` are in branches that cannot both run in one pass: `if c:` / `else:`,
        `if m == "x":` / `elif m == "y":`, `if use_lora:` / `if not use_lora:` (tests compared as written).

        Only `if`s outside loops count (an `if` in a loop can take both branches), and a test inside a
        helper is only compared within the same inlined call of that helper.
        """
        la, lb = self._path_literals(a), self._path_literals(b)
        return bool(la and lb) and any(_contradict(x, y) for x in la for y in lb)

    def _path_literals(self, step: Step) -> tuple:
        cache = self.__dict__.setdefault("_path_cache", {})
        key = id(step)
        hit = cache.get(key)
        if hit is not None and hit[0] is step:
            return hit[1]
        import re

        sites = self.site_calls(step)
        items: list[Item] = [step.item] + (sites[1:] if step.call is not None else sites)
        segments = re.findall(r"[^:]+@\d+:", step.prefix)
        out: list[tuple] = []
        for i, item in enumerate(items):
            if any(outer.loops or getattr(outer, "whiles", 0) for outer in items[i + 1:]):
                continue  # this helper runs in a loop: both branches of its `if`s may run
            prefix = "".join(segments[: len(segments) - i]) if i else step.prefix
            for g in item.guards:
                test = getattr(g.node, "test", None)
                if g.branch is None or g.loop_depth or test is None:
                    continue
                for lit in self._literals(test, g.branch == "body"):
                    out.append((prefix,) + lit)
        result = tuple(out)
        cache[key] = (step, result)
        return result

    def _literals(self, expr: cst.BaseExpression, positive: bool) -> list[tuple]:
        """A test as a conjunction of literals: ("atom", text, positive) or ("in", lhs, values, positive)."""
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
            return self._literals(expr.expression, not positive)
        if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And) == positive:
            return self._literals(expr.left, positive) + self._literals(expr.right, positive)
        if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1:
            comp = expr.comparisons[0]
            op = comp.operator
            values = _literal_values(comp.comparator, single=isinstance(op, (cst.Equal, cst.NotEqual, cst.Is, cst.IsNot)))
            if values is not None:
                pos = positive if isinstance(op, (cst.Equal, cst.Is, cst.In)) else not positive
                return [("in", _norm(self.code(expr.left)), values, pos)]
        return [("atom", _norm(self.code(expr)), positive)]

    def rank_guard(self, step: Step) -> Optional[cst.CSTNode]:
        """The `if` that runs this step on some ranks only (`rank == 0`, `dist.get_rank() == 0`, ...), if any."""
        import re

        call_form = re.compile(
            r"\b\w*rank\w*\(\)\s*(==|!=|<=|<|>|>=)\s*[01]\b|\b[01]\s*(==|!=)\s*[\w.]*rank\w*\(\)|\b\w*rank\w*\s+(not\s+)?in\s*[\[(]"
        )
        for c in self.site_calls(step):
            for g in c.guards:
                if g.kind in ("rank0", "not_rank0"):
                    return g.node
                test = getattr(g.node, "test", None)
                if test is not None and call_form.search(self.code(test)):
                    return g.node
            if c.scope_rank0:
                return c.scope.node
        return None

    def keyword(self, call: Call, name: str) -> Any:
        """The expression passed as `name=`, also through `**d` with `d = dict(...)`/`{...}`; None if absent,
        UNKNOWN if an unresolved `**kwargs` may hold it."""
        direct = call.kw(name)
        if direct is not None:
            return direct
        hidden = False
        for star in call.star_kwargs():
            d = star
            for _ in range(4):
                if isinstance(d, (cst.Name, cst.Attribute)):
                    dn = dotted(d)
                    d = self.binding(dn, call.scope) if dn else None
                else:
                    break
            if isinstance(d, cst.Call) and dotted(d.func) == "dict" and all(a.keyword is not None for a in d.args):
                for a in d.args:
                    if a.keyword.value == name:
                        return a.value
            elif isinstance(d, cst.Dict) and all(isinstance(e, cst.DictElement) for e in d.elements):
                for e in d.elements:
                    if isinstance(e.key, cst.SimpleString) and e.key.evaluated_value == name:
                        return e.value
            else:
                hidden = True
            if star is not None and isinstance(star, cst.Name):
                # `kwargs["name"] = v` after the dict was built.
                for ds in call.scope.dict_sets + self.c.module_scope.dict_sets:
                    if ds.target == star.value and ds.key == name and ds.seq < call.seq:
                        return ds.value
        return UNKNOWN if hidden else None

    def enclosing_withs(self, step: Step) -> list[cst.BaseExpression]:
        """With-items around this step, including those around the helper calls it was inlined through."""
        return [w for c in self.site_calls(step) for w in c.withs]

    # -- references ------------------------------------------------------------------
    def ref(self, expr: Optional[cst.BaseExpression], step: Step, _depth: int = 0) -> Optional[Ref]:
        if expr is None:
            return None
        child = False
        while True:
            if isinstance(expr, cst.Subscript):
                child = True
                expr = expr.value
            elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in (
                "get_submodule", "get_decoder",
            ):
                child = True
                expr = expr.func.value
            elif (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)
                  and expr.func.attr.value == "unwrap_model" and expr.args):
                # `accelerator.unwrap_model(model)` is the model itself, without its wrappers.
                expr = expr.args[0].value
            else:
                break
        d = dotted(expr)
        if d is None:
            return None
        parts = d.split(".")
        if parts[0] in HOLDERS and len(parts) > 1:
            root, rest = ".".join(parts[:2]), parts[2:]
        else:
            root, rest = parts[0], parts[1:]
        key = step.key(root)
        derived = self._derived.get(key)
        if derived is not None:
            key, child = derived, True
        elif root == parts[0] and _depth < 3:
            # `layers = model.model.layers`: a plain name bound once to a part of the model.
            scope = getattr(step.item, "scope", None)
            bound = self.binding(root, scope) if scope is not None else None
            if isinstance(bound, (cst.Attribute, cst.Subscript)):
                r = self.ref(bound, step, _depth + 1)
                if r is not None and r.child:
                    key, child = r.key, True
        path = tuple(a for a in rest if a not in TRANSPARENT)
        if path and path != ("model",):
            child = True
        return Ref(key, child, tuple(rest))

    # -- timeline construction -------------------------------------------------------
    def _build(self) -> None:
        self._derived: dict[str, str] = {}
        called: set[int] = set()
        for call in self.c.calls:
            callee = self._local_callee(call)
            if callee is not None and callee is not call.scope:
                called.add(id(callee))
        for scope in self.c.scopes:
            if id(scope) in called:
                continue
            steps = self._steps(scope, {}, "", 0, (id(scope),))
            if not steps:
                continue
            t = Timeline(self, scope, steps)
            self._derived = {}
            self._interpret(t)
            self.timelines.append(t)

    def _local_callee(self, call: Call) -> Optional[Scope]:
        f = call.func
        if f is None:
            return None
        if "." not in f:
            return self.c.functions.get(f)
        if f.startswith("self.") and f.count(".") == 1 and call.scope.klass:
            return self.c.methods.get((call.scope.klass, f[5:]))
        return None

    def _steps(self, scope: Scope, mapping: dict, prefix: str, depth: int, stack: tuple) -> list[Step]:
        items: list[Item] = sorted([*scope.calls, *scope.attr_sets, *scope.dict_sets], key=lambda i: i.seq)
        steps: list[Step] = []
        for item in items:
            step = Step(item, prefix, mapping)
            callee = self._local_callee(item) if isinstance(item, Call) else None
            if callee is not None and depth < 4 and id(callee) not in stack:
                sub_map: dict[str, str] = {}
                params = callee.params[1:] if callee.klass and callee.params[:1] == ["self"] else callee.params
                for i, p in enumerate(params):
                    arg = item.arg(i, p)
                    d = dotted(arg) if arg is not None else None
                    if d is not None:
                        sub_map[p] = step.key(d) if d.split(".")[0] not in HOLDERS else d
                sub_prefix = f"{prefix}{callee.name}@{item.seq}:"
                sub = self._steps(callee, sub_map, sub_prefix, depth + 1, stack + (id(callee),))
                steps.extend(sub)
                probe = Step(item, sub_prefix, sub_map)
                for r in callee.returns:
                    rd = dotted(r)
                    if rd is not None:
                        step.returns.append(probe.key(rd))
                    elif isinstance(r, cst.Tuple):
                        for el in r.elements:
                            ed = dotted(el.value)
                            step.returns.append(probe.key(ed) if ed else "")
            steps.append(step)
        return steps

    def _interpret(self, t: Timeline) -> None:
        for step in t.steps:
            item = step.item
            if isinstance(item, AttrSet):
                self._interpret_attr(t, step, item)
                continue
            call = item
            for ev in self._classify(t, step, call):
                ev.timeline = t
                t.events.append(ev)
            self._bind_result(t, step, call)

    def _bind_result(self, t: Timeline, step: Step, call: Call) -> None:
        targets = call.targets
        if not targets:
            return
        src_keys: list[Optional[str]] = []
        if call.api in SAME_MODEL_APIS:
            idx, kw = SAME_MODEL_APIS[call.api]
            r = self.ref(call.arg(idx, kw), step)
            src_keys = [r.key if r and not r.child else None]
        elif call.method in SAME_MODEL_METHODS:
            r = self.ref(call.receiver, step)
            src_keys = [r.key if r and not r.child else None]
        elif call.method == "unwrap_model" and self._is_accelerator(call.receiver):
            r = self.ref(call.arg(0, "model"), step)
            src_keys = [r.key if r and not r.child else None]
        elif call.method == "prepare" and self._is_accelerator(call.receiver):
            for a in call.node.args:
                r = self.ref(a.value, step)
                src_keys.append(r.key if r and not r.child else None)
        elif step.returns:
            src_keys = list(step.returns)
        elif call.api == "load_model":
            for tg in targets:
                d = dotted(tg)
                if d:
                    t.model_keys.add(self._target_key(step, d))
            return
        for tg in targets:
            if isinstance(tg, (cst.Tuple, cst.List)):
                for i, el in enumerate(tg.elements):
                    d = dotted(el.value)
                    if d and i < len(src_keys) and src_keys[i]:
                        t.uf.union(self._target_key(step, d), src_keys[i])
            else:
                d = dotted(tg)
                if d and src_keys and src_keys[0]:
                    t.uf.union(self._target_key(step, d), src_keys[0])

    def _target_key(self, step: Step, d: str) -> str:
        parts = d.split(".")
        if parts[0] in HOLDERS and len(parts) > 1:
            return step.key(".".join(parts[:2]))
        return step.key(parts[0]) if len(parts) == 1 else step.key(d)

    def _is_accelerator(self, expr: Optional[cst.BaseExpression]) -> bool:
        d = dotted(expr) if expr is not None else None
        return d is not None and ("accelerator" in d.lower() or self.bound_to(d, "Accelerator"))

    def is_trainer(self, expr: Optional[cst.BaseExpression]) -> bool:
        d = dotted(expr) if expr is not None else None
        return d is not None and ("trainer" in d.lower() or self.bound_to(d, "Trainer"))

    def bound_to(self, name: str, api: str) -> bool:
        """Whether `name` is assigned the result of an `api(...)` call anywhere in the file
        (flow-insensitive, like the resolver): objects are known by what built them, not their names."""
        for scope in self.c.scopes:
            for _, value in scope.assigns.get(name, ()):
                call = self.call_at(value)
                if call is not None and call.api == api:
                    return True
        return False

    def _interpret_attr(self, t: Timeline, step: Step, a: AttrSet) -> None:
        if a.key is not None:
            t.events.append(Event("dict_set", step, None, {"target": step.key(a.target), "key": a.key}, t))
            return
        if a.target.endswith(".requires_grad"):
            v = self.value(a.value, a.scope)
            if v is False and a.loops:
                r = self._loop_model(step, a.loops[-1].iter)
                if r is not None:
                    t.events.append(Event("freeze", step, r, {"partial": bool(a.guards)}, t))
            return
        if a.target.endswith("use_cache"):
            root = self._target_key(step, a.target.split(".config.")[0]) if ".config." in a.target else None
            r = Ref(root, False) if root else None
            t.events.append(Event("use_cache", step, r, {"value": self.value(a.value, a.scope)}, t))
            return
        # `layers = model.model.layers`: a name for a part of the model.
        d = dotted(a.value) if isinstance(a.value, (cst.Attribute, cst.Name)) else None
        if d is not None:
            r = self.ref(a.value, step)
            if r is not None and r.child:
                self._derived[self._target_key(step, a.target)] = r.key

    def _loop_model(self, step: Step, it: cst.BaseExpression) -> Optional[Ref]:
        """`model.parameters()` / `model.named_parameters()` / `model.modules()` → the model."""
        if isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute):
            if it.func.attr.value in ("parameters", "named_parameters", "modules", "named_modules", "children", "named_children"):
                r = self.ref(it.func.value, step)
                return r
            if it.func.attr.value == "enumerate" or dotted(it.func) in ("enumerate", "list", "reversed"):
                return self._loop_model(step, it.args[0].value) if it.args else None
        if isinstance(it, cst.Call) and dotted(it.func) in ("enumerate", "list", "reversed") and it.args:
            return self._loop_model(step, it.args[0].value)
        return None

    def _loop_child(self, step: Step, call: Call, name: str) -> Optional[Ref]:
        """If `name` is a loop variable over a part of the model, the model it belongs to."""
        for loop in reversed(call.loops):
            names = [n for n in loop.target.split(",")]
            if name in names:
                it = loop.iter
                r = self._loop_model(step, it)
                if r is not None:
                    return Ref(r.key, True, r.path)
                inner = it
                if isinstance(it, cst.Call) and dotted(it.func) in ("enumerate", "list", "reversed") and it.args:
                    inner = it.args[0].value
                if isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) and inner.func.attr.value in (
                    "items", "values",
                ):
                    inner = inner.func.value  # `for name, block in model.layers.items()` (ModuleDict)
                r = self.ref(inner, step)
                if r is not None:
                    return Ref(r.key, True, r.path)
        return None

    def model_ref(self, expr: Optional[cst.BaseExpression], step: Step, call: Call) -> Optional[Ref]:
        if isinstance(expr, cst.Name):
            lr = self._loop_child(step, call, expr.value)
            if lr is not None:
                return lr
        if isinstance(expr, (cst.List, cst.Tuple)) and expr.elements:
            refs = [self.model_ref(e.value, step, call) for e in expr.elements]
            refs = [r for r in refs if r is not None]
            return Ref(refs[0].key, True, refs[0].path) if refs else None
        return self.ref(expr, step)

    def _classify(self, t: Timeline, step: Step, call: Call) -> list[Event]:
        api, m = call.api, call.method
        out: list[Event] = []

        def ev(kind, expr, **data):
            r = self.model_ref(expr, step, call)
            if r is not None:
                t.model_keys.add(r.key)
            out.append(Event(kind, step, r, data, t))

        if api == "load_model":
            out.append(Event("load", step, None, {}, t))
        elif api in ("get_peft_model", "PeftModel_from_pretrained"):
            ev("lora", call.arg(0, "model"))
        elif api == "inject_adapter_in_model":
            ev("lora", call.arg(1, "model"))
        elif api == "prepare_model_for_kbit_training":
            ev("kbit_prep", call.arg(0, "model"))
        elif api == "FSDP1":
            ev("wrap1", call.arg(0, "module"))
        elif api == "fully_shard":
            ev("shard2", call.arg(0, "module"))
        elif api == "DDP":
            ev("ddp", call.arg(0, "module"))
        elif api == "optimizer":
            params = call.arg(0, "params")
            src, filtered = self._params_source(params, step, call)
            out.append(Event("optimizer", step, src, {"filtered": filtered, "params": params}, t))
        elif api == "torch_compile":
            ev("compile", call.arg(0, "model"))
        elif api in ("apply_activation_checkpointing", "checkpoint_wrapper"):
            ev("ac", call.arg(0, "model"))
        elif api == "get_peft_model_state_dict" or api == "get_model_state_dict":
            ev("state_dict", call.arg(0, "model"), api=api)
        elif api == "peft_fsdp_auto_wrap_policy":
            ev("peft_policy", call.arg(0, "model"))
        elif api == "clip_grad_norm_":
            src, _ = self._params_source(call.arg(0, "parameters"), step, call)
            out.append(Event("clip", step, src, {"torch_api": True}, t))
        elif api == "torch_save":
            obj = call.arg(0, "obj")
            if isinstance(obj, cst.Call) and isinstance(obj.func, cst.Attribute) and obj.func.attr.value == "state_dict":
                ev("torch_save_state_dict", obj.func.value)
        elif api == "init_process_group":
            out.append(Event("init_pg", step, None, {}, t))
        elif api == "cuda_set_device":
            out.append(Event("set_device", step, None, {}, t))
        elif m is not None and call.receiver is not None:
            recv = call.receiver
            if m == "prepare" and self._is_accelerator(recv):
                for a in call.node.args:
                    r = self.ref(a.value, step)
                    out.append(Event("prepare", step, r, {"n_args": len(call.node.args)}, t))
            elif m in ("get_state_dict", "save_state", "save_model") and self._is_accelerator(recv):
                ev("state_dict", call.arg(0, "model"), api=f"accelerator.{m}")
            elif m == "save_model" and self.is_trainer(recv):
                out.append(Event("state_dict", step, None, {"api": "trainer.save_model"}, t))
            else:
                kinds = {
                    "add_adapter": "lora",
                    "gradient_checkpointing_enable": "gc_enable",
                    "enable_input_require_grads": "input_require_grads",
                    "state_dict": "state_dict",
                    "save_pretrained": "save",
                    "generate": "generate",
                    "merge_and_unload": "merge",
                    "merge_adapter": "merge",
                    "to": "move",
                    "cuda": "move",
                    "no_sync": "no_sync",
                    "clip_grad_norm_": "clip",
                    "requires_grad_": "requires_grad_",
                }
                kind = kinds.get(m)
                if kind is not None:
                    r = self.ref(recv, step)
                    if r is not None and (t.is_model(t.find(r.key)) or "model" in r.key.lower() or m in MODEL_METHODS):
                        if kind in ("move",) and r.child:
                            return out
                        out.append(Event(kind, step, r, {"method": m}, t))
        return out

    def _params_source(self, params, step: Step, call: Call) -> tuple[Optional[Ref], bool]:
        """Which model an optimizer's params come from, and whether they were filtered."""
        filtered = False
        for _ in range(4):
            if isinstance(params, (cst.Name, cst.Attribute)) and not isinstance(params, cst.Call):
                d = dotted(params)
                bound = self.binding(d, call.scope) if d else None
                if bound is None:
                    return None, filtered
                params = bound
                continue
            break
        if isinstance(params, (cst.ListComp, cst.GeneratorExp)):
            filtered = filtered or bool(params.for_in.ifs)
            params = params.for_in.iter
        if isinstance(params, cst.Call):
            fn = dotted(params.func)
            if fn in ("filter", "list", "tuple") and params.args:
                filtered = filtered or fn == "filter"
                return self._params_source(params.args[-1].value, step, call)[0], filtered
            if isinstance(params.func, cst.Attribute) and params.func.attr.value in ("parameters", "named_parameters"):
                return self.ref(params.func.value, step), filtered
            if isinstance(params.func, cst.Attribute):
                # model.trainable_parameters(), get_param_groups(model), ...
                return None, True
        return None, filtered


def _norm(text: str) -> str:
    text = "".join(text.split())
    while text.startswith("(") and text.endswith(")") and text.count("(") == text.count(")"):
        text = text[1:-1]
    return text


def _literal_values(expr: cst.BaseExpression, single: bool) -> Optional[frozenset]:
    """The constant(s) a test compares with: `"a"`, `None`, `("a", "b")`; None when not constant."""
    if single:
        elements = [expr]
    elif isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
        elements = [e.value for e in expr.elements if not isinstance(e, cst.StarredElement)]
        if len(elements) != len(expr.elements):
            return None
    else:
        return None
    out = set()
    for e in elements:
        if isinstance(e, (cst.SimpleString, cst.Integer)):
            out.add(e.evaluated_value)
        elif isinstance(e, cst.Name) and e.value in ("None", "True", "False"):
            out.add({"None": None, "True": True, "False": False}[e.value])
        else:
            return None
    return frozenset(out)


def _contradict(x: tuple, y: tuple) -> bool:
    """Two path literals (prefix, kind, ...) that cannot both hold."""
    if x[0] != y[0] or x[1] != y[1]:
        return False
    if x[1] == "atom":
        return x[2] == y[2] and x[3] != y[3]
    _, _, lx, vx, px = x
    _, _, ly, vy, py = y
    if lx != ly:
        return False
    if px and py:
        return not (vx & vy)
    if px and not py:
        return vx <= vy
    if py and not px:
        return vy <= vx
    return False


def analyze(module: cst.Module) -> ScriptAnalysis:
    return ScriptAnalysis(module)
