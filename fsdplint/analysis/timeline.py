"""One program's calls in execution order, and the queries rules ask of it (before/after, wrap state)."""

from __future__ import annotations

import re
from functools import cached_property
from typing import TYPE_CHECKING, Iterable, Optional

import libcst as cst

from fsdplint.analysis.records import Event, Step, UnionFind
from fsdplint.apis import MODEL_LOADER_METHODS
from fsdplint.collect import Scope
from fsdplint.resolve import dotted

if TYPE_CHECKING:  # pragma: no cover
    from fsdplint.analysis.script import ScriptAnalysis

# Calls that take the model but cannot wrap or shard its submodules (see `Timeline.escapes`).
_HARMLESS_METHODS = {
    "to", "cuda", "cpu", "train", "eval", "half", "bfloat16", "float", "to_empty", "parameters", "named_parameters",
    "modules", "named_modules", "children", "named_children", "buffers", "named_buffers", "requires_grad_",
    "print_trainable_parameters", "gradient_checkpointing_enable", "enable_input_require_grads",
    "get_input_embeddings", "get_output_embeddings", "resize_token_embeddings", "tie_weights", "state_dict",
    "load_state_dict", "num_parameters", "get_nb_trainable_parameters", "forward", "generate", "info", "debug",
    "warning", "print",
}
_VERSION_TEST = re.compile(r"fsdp_version\([^)]*\)\s*==\s*([12])\b")
_ISINSTANCE_TEST = re.compile(r"isinstance\(\s*[\w.]+\s*,\s*(FSDPModule|FullyShardedDataParallel|FSDP)\s*\)")
_HARMLESS_FUNCS = {"print", "len", "isinstance", "sum", "type", "str", "repr", "id", "hasattr", "getattr", "list"}

_WRAPS = frozenset(("wrap1", "shard2"))


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
        # Names wrapped before the program starts (`def train(model: FSDP)`): key -> "fsdp1"/"fsdp2".
        self.assumed: dict[str, str] = {}

    def find(self, key: str) -> str:
        return self.uf.find(key)

    @cached_property
    def item_ids(self) -> frozenset:
        """ids of the calls and assignments this program runs (its entry function and inlined helpers)."""
        return frozenset(id(s.item) for s in self.steps)

    def _of_kinds(self, kinds: frozenset, entity: Optional[str]) -> list[Event]:
        """Events of these kinds on the entity, in execution order. Indexed once the timeline is built:
        rules ask per event, and scanning every event each time is quadratic in long files."""
        idx = self.__dict__.get("_index")
        if idx is None or idx[0] != len(self.events):
            by_kind: dict[str, list[Event]] = {}
            for e in self.events:
                by_kind.setdefault(e.kind, []).append(e)
            idx = self.__dict__["_index"] = (len(self.events), by_kind, {})
        _, by_kind, cache = idx
        key = (kinds, entity)
        hit = cache.get(key)
        if hit is None:
            hit = [e for k in kinds for e in by_kind.get(k, ()) if e.entity == entity]
            if len(kinds) > 1:
                hit.sort(key=lambda e: e.seq)
            cache[key] = hit
        return hit

    def of(self, kind: str, entity: Optional[str] = None) -> list[Event]:
        if entity is None:
            return [e for e in self.events if e.kind == kind]
        return list(self._of_kinds(frozenset((kind,)), entity))

    def before(self, event: Event, kinds: Iterable[str], entity: Optional[str] = None) -> list[Event]:
        """Events of these kinds on the entity that can run before `event` (not in an exclusive branch,
        nor before the name was bound to a freshly loaded model on the way to `event`)."""
        ent = entity if entity is not None else event.entity
        return [e for e in self._of_kinds(frozenset(kinds), ent) if e.seq < event.seq
                and not self.exclusive(e, event) and not self.rebound(ent, e, event)]

    def after(self, event: Event, kinds: Iterable[str], entity: Optional[str] = None) -> list[Event]:
        """Events of these kinds on the entity that can run after `event` (as `before`)."""
        ent = entity if entity is not None else event.entity
        return [e for e in self._of_kinds(frozenset(kinds), ent) if e.seq > event.seq
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
                if call.api == "load_model" or (call.api is None and call.method in MODEL_LOADER_METHODS) or (
                        call.api == "PeftModel_from_pretrained" and "AutoPeftModel" in (call.qualname or "")) \
                        or (call.qualname or "").startswith("peft.AutoPeftModel"):
                    # (`AutoPeftModelForCausalLM.from_pretrained(dir)` loads the base and the adapter anew;
                    # `PeftModel.from_pretrained(model, dir)` wraps an object the script already holds.)
                    out.append(step)
                    break
                call = self.analysis.call_at(call.receiver) if isinstance(call.receiver, cst.Call) else None
        return out

    def exclusive(self, a: Event, b: Event) -> bool:
        """True when the two events sit in branches that never both run (`if x:` / `else:`, `elif`, ...),
        or one is a wrap of one FSDP version and the other runs only for the other version
        (`if fsdp_version(model) == 2:`, `if isinstance(model, FSDPModule):`)."""
        if self.analysis.exclusive(a.step, b.step):
            return True
        for x, y in ((a, b), (b, a)):
            kind = getattr(x, "kind", None)  # rules may pass a bare step probe
            if kind in ("wrap1", "shard2"):
                v = self._version_guard(y.step)
                if v is not None and v != (1 if kind == "wrap1" else 2):
                    return True
        return False

    def _version_guard(self, step: Step) -> Optional[int]:
        """The FSDP version a step's guards (and its inlined call sites' guards) require, if they say."""
        for c in self.analysis.site_calls(step):
            for g in c.guards:
                test = getattr(g.node, "test", None)
                if test is None or g.branch != "body":
                    continue
                text = self.analysis.code(test)
                m = _VERSION_TEST.search(text)
                if m:
                    return int(m.group(1))
                m = _ISINSTANCE_TEST.search(text)
                if m and not text.lstrip().startswith("not"):
                    return 2 if m.group(1) == "FSDPModule" else 1
        return None

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
            if call is None or call.api is not None or call.func in _HARMLESS_FUNCS:
                continue
            if call.func in (step.origin.collector if step.origin is not None else a.c).functions:
                continue
            if id(call) in a._known_calls:  # a project function: inlined, or known to leave models alone
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
        state = next((v for k, v in self.assumed.items() if self.find(k) == entity), None)
        for e in self._of_kinds(_WRAPS, entity):
            if e.seq >= seq:
                break
            if at is not None and (self.exclusive(e, at) or self.rebound(entity, e, at)):
                continue
            if e.kind == "wrap1":
                state = "fsdp1"
            elif e.kind == "shard2":
                state = "fsdp2"
        return state


