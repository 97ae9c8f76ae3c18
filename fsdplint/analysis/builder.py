"""Builds the timelines: inlines same-file helpers, binds names to models, classifies calls into events."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import libcst as cst

from fsdplint.analysis.classes import Classes
from fsdplint.analysis.lightning import is_fabric
from fsdplint.analysis.linking import Linking
from fsdplint.analysis.records import SAME_MODEL_APIS, SAME_MODEL_METHODS, UNKNOWN, Event, Item, Ref, Step
from fsdplint.apis import CALL_EFFECTS, CALL_FACTS
from fsdplint.analysis.timeline import Timeline
from fsdplint.collect import AttrSet, Call, Scope
from fsdplint.resolve import dotted

# The name a helper's `return <call>` binds the call's result to (not a name Python code can write).
RETURNED = "__returned__"


def anonymous_key(call: Call) -> str:
    """The name standing for the unnamed result of a model load nested in another call (per call site;
    the step's prefix makes it per inlining)."""
    return f"__loaded_{call.seq}__"

# Attributes that reach the same model through a wrapper.
TRANSPARENT = {"module", "base_model", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}
# Roots whose first attribute names the object (`self.model`, `trainer.model`).
HOLDERS = {"self", "cls", "trainer", "state", "args", "accelerator", "engine", "ctx", "runner"}
MODEL_METHODS = {
    "gradient_checkpointing_enable", "add_adapter", "save_pretrained", "generate", "merge_and_unload",
    "merge_adapter", "print_trainable_parameters", "enable_input_require_grads", "get_input_embeddings",
}

def _hook_model(expr: cst.BaseExpression, mapping: dict) -> Optional[str]:
    """`kwargs["model"]` / `kwargs.get("model")` in a hook whose `**kwargs` carry the trainer's model
    (`Classes._hook_params`): the key of that model."""
    name = key = None
    if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Name) and len(expr.slice) == 1:
        sl = expr.slice[0].slice
        if isinstance(sl, cst.Index) and isinstance(sl.value, cst.SimpleString):
            name, key = expr.value.value, sl.value.evaluated_value
    elif (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "get"
          and isinstance(expr.func.value, cst.Name) and expr.args and isinstance(expr.args[0].value, cst.SimpleString)):
        name, key = expr.func.value.value, expr.args[0].value.evaluated_value
    if name is None or key != "model":
        return None
    return mapping.get(f"**{name}")
# Inlining: every helper up to `_FREE_DEPTH` calls deep; beyond, until `_DEEP_BUDGET` calls and
# assignments of deeper helpers were inlined for the linted file (at most `_MAX_DEPTH` deep).
_FREE_DEPTH = 4
_MAX_DEPTH = 8
_DEEP_BUDGET = 150  # a loader chain four modules and seven calls deep takes about 50
# Fabric's wrap points: `fabric.setup(model, *optimizers)` and `fabric.setup_module(model)`.
FABRIC_SETUP = ("setup", "setup_module")


class Builder(Classes, Linking):
    """Mixin of `ScriptAnalysis`: turns the collector's records into timelines of events."""

    # -- references ------------------------------------------------------------------
    def ref(self, expr: Optional[cst.BaseExpression], step: Step, _depth: int = 0) -> Optional[Ref]:
        if expr is None:
            return None
        hook = _hook_model(expr, step.mapping)
        if hook is not None:
            return Ref(step.key(hook), False, ("model",))
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
            # `setup_fsdp(load_model(name))`: a nested call of an inlined helper is the object it returned.
            returned = self._returned.get(id(expr)) if isinstance(expr, cst.Call) else None
            if returned:
                return Ref(returned, False)
            return self._nested_ref(expr, step, _depth) if isinstance(expr, cst.Call) else None
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

    def _nested_ref(self, expr: cst.Call, step: Step, depth: int) -> Optional[Ref]:
        """The object a call written inside another expression stands for: `FSDP(get_peft_model(m, cfg))`
        wraps `m` itself (the library returns the model it was given), and `FSDP(AutoModel.from_pretrained(...))`
        wraps the object that load made, which has no name: it gets one of its own (`anonymous_key`), so the
        load and what is done to its result are events on one model."""
        if depth > 4:
            return None
        call = self.call_at(expr)
        if call is None:
            return None
        if call.api in SAME_MODEL_APIS:
            idx, kw = SAME_MODEL_APIS[call.api]
            inner = call.arg(idx, kw)
            return self.ref(inner, step, depth + 1) if inner is not None else None
        if call.method in SAME_MODEL_METHODS and call.receiver is not None:
            return self.ref(call.receiver, step, depth + 1)
        if call.api == "load_model":
            return Ref(step.key(anonymous_key(call)), False)
        return None

    # -- timeline construction -------------------------------------------------------
    # Set by `ScriptAnalysis`: the project the file belongs to (analysis/index.py) and the file's path.
    project: Any = None
    path: Optional[Path] = None

    def _init_build_state(self) -> None:
        """The builder's records, empty: set before anything (the argument values too) can look into the
        project's other modules."""
        self._derived: dict[str, str] = {}
        self._origins: dict[int, Any] = {}  # id(scope) -> the other module of the project it belongs to
        self._foreign_mods: list = []
        self._segments: dict[str, Call] = {}  # "<module>.<seq>" -> a call in another module a helper ran through
        self._scope_sites: dict[int, Call] = {}  # id(scope of another module) -> first call site in this file
        self._foreign_seen: set[int] = set()
        # ids of calls to functions whose code the analysis saw (inlined) or knows harmless (`Timeline.escapes`).
        self._known_calls: set[int] = set()
        self._hops: dict[Path, int] = {}  # module of the project -> how many modules away from this file
        self._callees: dict[int, tuple] = {}  # id(call) -> its project callee (memo)
        self._inline_sites: dict[int, list[Call]] = {}  # id(helper scope) -> the calls it was inlined at
        self._returned: dict[int, str] = {}  # id(call node of an inlined helper) -> the key it returns
        self._instances: dict[str, str] = {}  # key of a name -> `self` of the object of the class last built into it
        self.foreign_calls: list[Call] = []
        self._deep_budget = _DEEP_BUDGET  # calls and assignments inlined beyond `_FREE_DEPTH`, per linted file
        # What a bound on the work per file left out, as (the call's node, what), first one per bound: said
        # (FSDP905) so that a finding the cut hides is not silently missing.
        self.cutoffs: list[tuple] = []
        # Every call into project code that the bounds left unread, as (call, what): a rule that claims an
        # absence ("never set") cannot rule out that this code does it (see `ScriptAnalysis.unseen`).
        self.unfollowed: list[tuple] = []
        self._volatile = False  # set while resolving a callee that this inlining's arguments decided

    def _build(self) -> None:
        called: set[int] = set()
        for call in self.c.calls:
            callee = self._same_file_callee(call, self.c)
            if callee is not None and callee is not call.scope:
                called.add(id(callee))
        entries = [s for s in self.c.scopes if id(s) not in called]
        for scopes in self._programs(entries):
            steps: list[Step] = []
            for scope in scopes:
                prefix = f"{scope.name}:" if len(scopes) > 1 else ""
                steps.extend(self._steps(scope, self._hook_params(scope), prefix, 0, (id(scope),)))
            if not steps:
                continue
            t = Timeline(self, scopes[0], steps)
            t.assumed = self._assumed_wraps(scopes, t)
            self._derived = {}
            self._interpret(t)
            self.timelines.append(t)

    def _same_file_callee(self, call: Call, c) -> Optional[Scope]:
        f = call.func
        if f is None:
            return None
        if "." not in f:
            # A function defined in the caller's own body (`def _to_cpu(t): ...` inside the helper) first, then
            # in the functions around it (`main()` and its helpers all defined inside one `run()`).
            nested, enclosing = getattr(c, "nested", {}), getattr(c, "enclosing", {})
            s = call.scope
            for _ in range(8):
                hit = nested.get((id(s), f))
                if hit is not None:
                    return hit
                s = enclosing.get(id(s))
                if s is None:
                    break
            return c.functions.get(f)
        if f.startswith("self.") and f.count(".") == 1 and call.scope.klass:
            return c.methods.get((call.scope.klass, f[5:]))
        return None

    def _local_callee(self, call: Call) -> Optional[Scope]:
        return self._callee(call, self._origins.get(id(call.scope)))[0]

    def _steps(self, scope: Scope, mapping: dict, prefix: str, depth: int, stack: tuple,
               origin: Any = None, site: Optional[Call] = None, flags: Optional[dict] = None) -> list[Step]:
        items: list[Item] = sorted([*scope.calls, *scope.attr_sets, *scope.dict_sets, *scope.aliases], key=lambda i: i.seq)
        if self._dead:  # code the known argument values rule out
            items = [i for i in items if id(i) not in self._dead]
        if flags:  # code this call site's constant arguments rule out (`setup(cfg, apply_fsdp=False)`)
            items = [i for i in items if not any(_flag_dead(g, flags) for g in i.guards)]
        if origin is not None and self.env is not None:
            # Another module's function, run with the parsed arguments passed on (`get_config(model_args)`):
            # its branches on them are decided by the same values.
            dead = [i for i in items if i.guards and self.dead(i)]
            if dead:
                self._dead.update(id(i) for i in dead)
                items = [i for i in items if id(i) not in self._dead]
        steps: list[Step] = []
        for item in items:
            step = Step(item, prefix, mapping, origin=origin, site=site)
            if origin is not None and isinstance(item, Call) and id(item) not in self._foreign_seen:
                self._foreign_seen.add(id(item))
                self.foreign_calls.append(item)
            callee, callee_origin = self._callee(item, origin) if isinstance(item, Call) else (None, None)
            if callee is not None and id(callee) not in stack and not self._may_inline(callee, depth):
                self._note_cutoff(item, callee, depth)
            elif callee is not None and id(callee) not in stack:
                self._known_calls.add(id(item))
                sites = self._inline_sites.setdefault(id(callee), [])
                if item not in sites:
                    sites.append(item)
                sub_map: dict[str, str] = {}
                sub_flags: dict[str, bool] = {}
                params = callee.params[1:] if callee.klass and callee.params[:1] == ["self"] else callee.params
                for i, p in enumerate(params):
                    arg = item.arg(i, p)
                    if isinstance(arg, cst.Name) and arg.value in ("True", "False") and not any(
                            a.star for a in item.node.args):
                        sub_flags[p] = arg.value == "True"
                    d = dotted(arg) if arg is not None else None
                    if d is not None:
                        sub_map[p] = step.key(d) if d.split(".")[0] not in HOLDERS else d
                    elif isinstance(arg, cst.Call) and self._returned.get(id(arg)):
                        sub_map[p] = self._returned[id(arg)]  # the helper's result, passed on directly
                    elif isinstance(arg, (cst.Call, cst.ListComp, cst.GeneratorExp)):
                        # `clip(model.parameters())`, `clip([p for m in parts for p in m.parameters()])`: the
                        # helper's parameter stands for the model whose parameters it receives.
                        src, _ = self._params_source(arg, step, item)
                        if src is not None and not src.child:
                            sub_map[p] = src.key
                if origin is None:
                    tag = str(item.seq)
                else:
                    tag = f"{self._foreign_mods.index(origin) + 1}.{item.seq}"
                    self._segments[tag] = item
                sub_site = item if origin is None and callee_origin is not None else site
                if callee_origin is not None:
                    self._scope_sites.setdefault(id(callee), sub_site)
                sub_prefix = f"{prefix}{callee.name}@{tag}:"
                if callee.klass and callee.params[:1] == ["self"]:
                    sub_map["self"] = self._self_key(step, item, callee, sub_prefix)
                sub = self._steps(callee, sub_map, sub_prefix, depth + 1, stack + (id(callee),),
                                  callee_origin, sub_site, sub_flags)
                steps.extend(sub)
                probe = Step(item, sub_prefix, sub_map)
                for r in callee.returns:
                    key = self._returned_key(r, probe) if not isinstance(r, cst.Tuple) else None
                    if key is not None:
                        step.returns.append(key)
                    elif isinstance(r, cst.Tuple):
                        for el in r.elements:
                            ed = dotted(el.value)
                            step.returns.append(probe.key(ed) if ed else "")
                if len(step.returns) == 1 or len(set(step.returns)) == 1:
                    self._returned[id(item.node)] = step.returns[0]
            steps.append(step)
        return steps

    def _returned_key(self, r: cst.BaseExpression, probe: Step, depth: int = 0) -> Optional[str]:
        """The object a helper's `return` expression hands back: a name (`return model`), what an inlined
        helper returns (`return loader.load(...)`), or the model a library call returns as itself
        (`return get_peft_model(model, cfg)`, `return fully_shard(m)`, `return model.cuda()`), however nested."""
        if depth > 4:
            return None
        rd = dotted(r)
        if rd is not None:
            return probe.key(rd)
        if not isinstance(r, cst.Call):
            return None
        if self._returned.get(id(r)):
            return self._returned[id(r)]
        call = self.call_at(r)
        if call is None:
            return None
        if call.api in SAME_MODEL_APIS:
            idx, kw = SAME_MODEL_APIS[call.api]
            inner = call.arg(idx, kw)
        elif call.method in SAME_MODEL_METHODS or (call.method == "unwrap_model" and self._is_accelerator(call.receiver)):
            inner = call.receiver if call.method != "unwrap_model" else call.arg(0, "model")
        elif call.api == "load_model" and depth > 0:
            # `return FSDP(AutoModel.from_pretrained(...))`: the loaded object, named by its call.
            return probe.key(anonymous_key(call))
        else:
            # `return AutoModel.from_pretrained(...)`: the object that call's result was bound to.
            return probe.key(RETURNED) if depth == 0 else None
        return self._returned_key(inner, probe, depth + 1) if inner is not None else None

    def _note_cutoff(self, call: Call, callee: Scope, depth: int) -> None:
        """Remember the first helper left out by the depth bound and the first left out by the budget."""
        if not (callee.calls or callee.attr_sets):
            return  # nothing in it to analyse: nothing missed
        self.unfollowed.append((call, f"{callee.name}()", callee))
        kind = "depth" if depth >= _MAX_DEPTH else "budget"
        if any(k == kind for k, _, _ in self.cutoffs):
            return
        why = (f"{_MAX_DEPTH} helper calls deep" if kind == "depth" else
               f"after the per-file budget of {_DEEP_BUDGET} calls inlined beyond {_FREE_DEPTH} helper calls deep was spent")
        self.cutoffs.append((kind, call, f"{callee.name}() (called {why})"))

    def _may_inline(self, callee: Scope, depth: int) -> bool:
        """Helpers run inline up to four calls deep; deeper ones (a loader chain) draw on a budget of inlined
        calls per linted file, so depth costs what it runs, not a fixed cut-off."""
        if depth < _FREE_DEPTH:
            return True
        if depth >= _MAX_DEPTH or self._deep_budget <= 0:
            return False
        self._deep_budget -= len(callee.calls) + len(callee.attr_sets) + 1
        return True

    def _self_key(self, step: Step, call: Call, callee: Scope, sub_prefix: str) -> str:
        """The object a method inlined at `call` runs on: `self` of the caller for `self.m()`, the receiver
        for `obj.m()`, the object assigned for `obj = Cls(...)` (its `__init__`)."""
        if call.func is not None and call.func.startswith("self."):
            return step.key("self")
        if callee.name == "__init__" and call.method != "__init__":
            # A new object for each construction: `w = Worker(a); w.setup(); w = Worker(b); w.setup()` are two
            # objects, whose `self.x` must not merge. Later method calls on the name run on the latest one.
            d = dotted(call.targets[0]) if len(call.targets) == 1 else None
            fresh = f"{sub_prefix}self"
            if d:
                self._instances[self._target_key(step, d)] = fresh
            return fresh
        r = self.ref(call.receiver, step)
        if r is None or r.child:
            return f"{sub_prefix}self"
        return self._instances.get(r.key, r.key)

    def _interpret(self, t: Timeline) -> None:
        for step in t.steps:
            item = step.item
            if isinstance(item, AttrSet):
                self._interpret_attr(t, step, item)
                continue
            call = item
            for ev in self._classify(t, step, call):
                ev.timeline = t
                self._library_facts(call, ev)
                t.events.append(ev)
            self._bind_result(t, step, call)
            for ev in self._library_effects(t, step, call):
                t.events.append(ev)
            if call.api in ("Trainer", "composer_Trainer"):
                ev = self._trainer_wrap(t, step, call)
                if ev is not None:
                    t.events.append(ev)

    def _library_effects(self, t: Timeline, step: Step, call: Call) -> list[Event]:
        """What the library call does to the model beyond its name (apis.CALL_EFFECTS), as the events the
        script would have had to write: e.g. `shard2` on what `from_pretrained(distributed_config=...)`
        returns. Each event's data says `by` (the call) and `behaviour` (the version table's key)."""
        q = call.qualname or ""
        # trl's effects are keyed by the public name (`trl.SFTTrainer`, `trl.<Class>.from_pretrained`), whatever
        # module the script imports it from.
        effects = CALL_EFFECTS.get(call.api or "", ())
        if q.startswith("trl."):
            effects += CALL_EFFECTS.get("trl." + q.rsplit(".", 1)[-1], ())
            if q.count(".") >= 2:
                effects += CALL_EFFECTS.get("trl." + ".".join(q.rsplit(".", 2)[-2:]), ())
        targets = self.result_targets(call)
        if not effects:
            return []
        target = dotted(targets[0]) if len(targets) == 1 else None
        out = []
        for kind, on, cond, key in effects:
            if not self._effect_applies(call, cond):
                continue
            if on == "result":
                if target is None:
                    continue
                r = Ref(self._target_key(step, target), False)
            else:  # "result.model": the returned object's model, the one passed as `model=`
                r = self._trainer_model(t, step, call)
                if r is None:
                    continue
            t.model_keys.add(r.key)
            data = {"by": call.qualname or call.api, "behaviour": key, "implicit": True}
            open_ = self._effect_open(call, cond)
            if open_:
                data["open"] = open_  # the keyword whose value is not known: it may be None (no effect)
            out.append(Event(kind, step, r, data, t))
        return out

    def _trainer_wrap(self, t: Timeline, step: Step, call: Call) -> Optional[Event]:
        """`Trainer(model=...)` (transformers', trl's): the trainer that wraps the model with the job's FSDP plan
        when it trains (`accelerator.prepare` inside `train()`), after what its own construction did to the
        model (trl's `peft_config=`). An event on the trainer's model, after the construction's own events;
        analysis/framework.py says with which plan (an event, not a wrap: without FSDP in the job it is nothing)."""
        r = self._trainer_model(t, step, call)
        if r is None:
            return None
        return Event("trainer_wrap", step, r, {"by": call.qualname or call.api, "api": call.api}, t)

    def _trainer_model(self, t: Timeline, step: Step, call: Call) -> Optional[Ref]:
        """The model of the trainer `call` builds: `<name>.model` of the name it is bound to, one object with the
        `model=` it is given; a trainer nobody names (`SFTTrainer(model="org/name", ...).train()`) has a model
        of its own, named by the call."""
        targets = self.result_targets(call)
        target = dotted(targets[0]) if len(targets) == 1 else None
        r = self.ref(cst.parse_expression(f"{target}.model"), step) if target else None
        given = self.ref(call.arg(0, "model"), step)
        if r is None and given is not None and not given.child:
            return given
        if r is None:
            return Ref(step.key(f"__trainer_model_{call.seq}__"), False)
        if given is not None and not given.child:
            t.uf.union(r.key, given.key)
        return r

    def _effect_open(self, call: Call, cond: tuple) -> Optional[str]:
        """The keyword of a ("given", keyword) condition whose value cannot be read (`peft_config=peft_config`
        returned by a helper that leaves it None on some paths): the effect may not happen."""
        if cond[0] == "all":
            return next((k for k in (self._effect_open(call, c) for c in cond[1:]) if k), None)
        if cond[0] == "given":
            expr = self.keyword(call, cond[1])
            if expr is not None and expr is not UNKNOWN and self.may_be_none(expr, call.scope):
                return cond[1]
        return None

    def _effect_applies(self, call: Call, cond: tuple) -> bool:
        if cond[0] == "all":
            return all(self._effect_applies(call, c) for c in cond[1:])
        if cond[0] == "quantized":
            return self._loaded_quantized(call.arg(0, cond[1]), call)
        if cond[0] == "loads_quantized":  # the call is the 4-/8-bit load itself
            return self._loaded_quantized(call.node, call)
        if cond[0] == "given":
            expr = self.keyword(call, cond[1])
            return expr is not None and expr is not UNKNOWN and self.value(expr, call.scope) is not None
        if cond[0] == "product_gt_1":
            _, kw, api, fields = cond
            expr = self.keyword(call, kw)
            if expr is None or expr is UNKNOWN:
                return False
            if not isinstance(expr, cst.Call):
                d = dotted(expr)
                expr = self.binding(d, call.scope) if d else None
            inner = self.call_at(expr) if isinstance(expr, cst.Call) else None
            if inner is None or inner.api != api:
                return False
            product = 1
            for f in fields:
                given = inner.kw(f)
                if given is None:
                    continue
                v = self.value(given, inner.scope)
                if not isinstance(v, int) or isinstance(v, bool):
                    return False
                product *= v
            return product > 1
        return False

    def _library_facts(self, call: Call, ev: Event) -> None:
        """What the library call does beyond its name (apis.CALL_FACTS), as facts on the event:
        e.g. `adapter_dtype="float32"` for `get_peft_model` unless `autocast_adapter_dtype=False`."""
        for kind, fact, value, keyword, off, _cite in CALL_FACTS.get(call.api or "", ()):
            if kind != ev.kind or fact in ev.data:
                continue
            given = call.kw(keyword)
            if given is not None:
                v = self.value(given, call.scope)
                if v is UNKNOWN or v == off:
                    continue  # turned off, or it cannot be told: no fact
            ev.data[fact] = value

    def _loaded_quantized(self, expr: Optional[cst.BaseExpression], at: Call) -> bool:
        """`expr` is a model loaded in 4 or 8 bits: from_pretrained with a BitsAndBytesConfig (or the legacy
        load_in_4bit / load_in_8bit keywords) whose flag is known to be True."""
        load = self.call_for(expr, at.scope, "load_model")
        if load is None:
            return False
        flags = ("load_in_4bit", "load_in_8bit")
        q = self.keyword(load, "quantization_config")
        if q is UNKNOWN:
            return False
        if q is not None:
            bnb = self.call_for(q, load.scope, "BitsAndBytesConfig")
            if bnb is None:
                return False
            load = bnb
        for flag in flags:
            v = self.keyword(load, flag)
            if v is not None and v is not UNKNOWN and self.value(v, load.scope) is True:
                return True
        return False

    def result_targets(self, call: Call) -> list:
        """What a call's result is bound to: its assignment targets, or for `return <call>` a name standing for
        the returned object (`RETURNED`), which the caller's assignment is joined to (`_returned_key`)."""
        if call.targets:
            return call.targets
        node = call.stmt.node if call.stmt is not None else None
        if isinstance(node, cst.SimpleStatementLine) and any(
                isinstance(s, cst.Return) and s.value is call.node for s in node.body):
            return [cst.Name(RETURNED)]
        return []

    def _bind_result(self, t: Timeline, step: Step, call: Call) -> None:
        targets = self.result_targets(call)
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
        elif (call.method == "prepare" and self._is_accelerator(call.receiver)) or (
                call.method in FABRIC_SETUP and is_fabric(self, call.receiver)):
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
        if "." not in a.target:
            # `net = model`: a second name for the same object (LoRA injected through it is the model's).
            r = self._same_either_way(t, a.value, step) if isinstance(a.value, cst.IfExp) else self.ref(a.value, step)
            if r is not None and not r.child and a.value is not None:
                t.uf.union(step.key(a.target), r.key)
            return
        if self._new_parameter(a.value, a.scope):
            # `module.lora_A = nn.Parameter(...)`: a parameter the module did not have when it was wrapped.
            obj = cst.parse_expression(a.target.rpartition(".")[0])
            r = self.model_ref(obj, step, a) if isinstance(obj, cst.Name) else self.ref(obj, step)
            if r is not None:
                t.events.append(Event("new_params", step, r, {"name": a.target.rpartition(".")[2]}, t))
            return
        if a.target.endswith(".requires_grad"):
            v = self.value(a.value, a.scope)
            if v is False and a.loops:
                r = self._loop_model(step, a.loops[-1].iter)
                if r is not None:
                    t.events.append(Event("freeze", step, r, {"partial": _freezes_part(r, a.loops[-1])}, t))
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

    def _same_either_way(self, t: Timeline, value: cst.IfExp, step: Step) -> Optional[Ref]:
        """`a if c else b` where both branches name the same model (`accelerator.unwrap_model(m) if c else m`):
        that model; None when the branches may hold different objects."""
        body, orelse = self.ref(value.body, step), self.ref(value.orelse, step)
        if body is None or orelse is None or body.child or orelse.child or t.find(body.key) != t.find(orelse.key):
            return None
        return body

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
        elif api == "get_total_norm":
            # The norm half of clip_grad_norm_ (over the grads of the params the comprehension reads).
            src, _ = self._params_source(call.arg(0, "tensors"), step, call)
            out.append(Event("clip", step, src, {"torch_api": True, "norm_only": True}, t))
        elif api == "torch_save":
            obj = call.arg(0, "obj")
            if isinstance(obj, cst.Call) and isinstance(obj.func, cst.Attribute) and obj.func.attr.value == "state_dict":
                ev("torch_save_state_dict", obj.func.value)
        elif api == "init_process_group":
            out.append(Event("init_pg", step, None, {}, t))
        elif api == "cuda_set_device":
            out.append(Event("set_device", step, None, {}, t))
        elif call.func == "setattr" and len(call.node.args) == 3 and self._new_parameter(call.arg(2), call.scope):
            # `setattr(module, "lora_A", nn.Parameter(...))` over the model's modules: a project's own adapter.
            ev("new_params", call.arg(0), name=self.value(call.arg(1), call.scope))
        elif m == "register_parameter" and self._new_parameter(call.arg(1, "param"), call.scope):
            ev("new_params", call.receiver, name=self.value(call.arg(0, "name"), call.scope))
        elif m is not None and call.receiver is not None:
            recv = call.receiver
            if m in FABRIC_SETUP and is_fabric(self, recv) and call.node.args:
                # Lightning Fabric wraps the module with its strategy (FSDP1 under FSDPStrategy): analysis/lightning.py
                ev("lightning_setup", call.arg(0, "module"), method=m,
                   optimizers=[x.value for x in call.node.args[1:] if x.keyword is None and not x.star])
            elif m == "prepare" and self._is_accelerator(recv):
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

    def _new_parameter(self, expr, scope) -> bool:
        """`nn.Parameter(x)` (also through a name bound once), trainable: a parameter object made here. Not
        one made of `distribute_tensor(...)` (the code places its shards itself), nor one with
        `requires_grad=False` (no gradient to reduce)."""
        d = dotted(expr) if isinstance(expr, cst.Name) else None
        if d is not None:
            expr = self.binding(d, scope)
        call = self.call_at(expr) if isinstance(expr, cst.Call) else None
        if call is None or call.api != "nn_Parameter":
            return False
        if self.value(call.arg(1, "requires_grad"), call.scope) is False:
            return False
        data = call.arg(0, "data")
        for _ in range(3):
            if isinstance(data, cst.Name):
                data = self.binding(data.value, call.scope)
            elif isinstance(data, cst.Call) and isinstance(data.func, cst.Attribute) and data.func.attr.value in (
                    "to", "detach", "clone", "contiguous"):
                data = data.func.value
            else:
                break
        inner = self.call_at(data) if isinstance(data, cst.Call) else None
        return inner is None or (inner.qualname or "").rsplit(".", 1)[-1] != "distribute_tensor"

    def _params_source(self, params, step: Step, call: Call, _depth: int = 0) -> tuple[Optional[Ref], bool]:
        """Which model an optimizer's params come from, and whether they were filtered: through names,
        comprehensions (`[p for n, p in d.items() if ...]`, `{n: p for n, p in model.named_parameters()}`)
        and param groups (`[{"params": decay}, {"params": no_decay}]`)."""
        filtered = False
        for _ in range(4):
            if isinstance(params, (cst.Name, cst.Attribute)) and not isinstance(params, cst.Call):
                d = dotted(params)
                if d in step.mapping and d in call.scope.params and (
                        d not in call.scope.assigns or self._refined_binding(d, call.scope, True) is not None):
                    return Ref(step.mapping[d], False), filtered  # a helper's parameter: the caller's params
                bound = self.binding(d, call.scope) if d else None
                if bound is None and d is not None and "." not in d:
                    bound = self._refined_binding(d, call.scope)
                    filtered = filtered or bound is not None
                if bound is None:
                    return None, filtered
                params = bound
                continue
            break
        if _depth > 4:
            return None, filtered
        if isinstance(params, (cst.List, cst.Tuple)) and params.elements:
            # Param groups: the model the groups' params come from (the first one that tells).
            for el in params.elements:
                v = el.value
                if isinstance(v, cst.Dict):
                    v = next((e.value for e in v.elements if isinstance(e, cst.DictElement)
                              and self.value(e.key, call.scope) == "params"), None)
                src, f = self._params_source(v, step, call, _depth + 1) if v is not None else (None, False)
                if src is not None:
                    return src, True if len(params.elements) > 1 else (filtered or f)
            return None, filtered
        if isinstance(params, (cst.ListComp, cst.GeneratorExp, cst.DictComp)):
            filtered = filtered or bool(params.for_in.ifs)
            inner = params.for_in.inner_for_in
            if inner is not None:
                # `[p for m in model_parts for p in m.parameters()]`: the params of the modules listed.
                filtered = filtered or bool(inner.ifs)
                it = inner.iter
                if (isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute) and not it.args
                        and it.func.attr.value in ("parameters", "named_parameters")
                        and isinstance(params.for_in.target, cst.Name)
                        and dotted(it.func.value) == params.for_in.target.value):
                    return self._modules_source(params.for_in.iter, step, call), filtered
                return None, filtered
            params = params.for_in.iter
            if (isinstance(params, cst.Call) and isinstance(params.func, cst.Attribute)
                    and params.func.attr.value in ("items", "values") and not params.args):
                params = params.func.value
            if isinstance(params, (cst.Name, cst.Attribute)):
                src, f = self._params_source(params, step, call, _depth + 1)
                return src, filtered or f
        if isinstance(params, cst.Call):
            fn = dotted(params.func)
            if fn in ("filter", "list", "tuple") and params.args:
                filtered = filtered or fn == "filter"
                src, f = self._params_source(params.args[-1].value, step, call, _depth + 1)
                return src, filtered or f
            if isinstance(params.func, cst.Attribute) and params.func.attr.value in ("parameters", "named_parameters"):
                return self.ref(params.func.value, step), filtered
            if isinstance(params.func, cst.Attribute):
                # model.trainable_parameters(), get_param_groups(model), ...
                return None, True
        return None, filtered

    def _modules_source(self, expr, step: Step, call: Call) -> Optional[Ref]:
        """`model_parts` bound to `[model]` (a list of the model's modules): that model."""
        for _ in range(3):
            d = dotted(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
            if d is None:
                break
            expr = self.binding(d, call.scope)
        if isinstance(expr, (cst.List, cst.Tuple)) and expr.elements:
            return self.ref(expr.elements[0].value, step)
        return None

    def _refined_binding(self, name: str, scope: Scope, param: bool = False) -> Optional[cst.BaseExpression]:
        """A name assigned once from a source and then only refined from itself
        (`d = {n: p for n, p in model.named_parameters()}; d = {n: p for n, p in d.items() if p.requires_grad}`):
        the first assignment, the source of them all. `param`: the name is a parameter, every assignment
        refines it (`parameters = list(parameters)`); returns the first of them."""
        vals = scope.assigns.get(name) if scope is not None else None
        if not vals or (len(vals) < 2 and not param):
            return None
        first, rest = vals[0][1], [v for _, v in (vals if param else vals[1:])]
        for v in rest:
            if isinstance(v, cst.Call) and dotted(v.func) in ("list", "tuple") and len(v.args) == 1:
                if dotted(v.args[0].value) == name:
                    continue
                return None
            if not isinstance(v, (cst.ListComp, cst.DictComp, cst.GeneratorExp)) or dotted(_comp_source(v)) != name:
                return None
        return first


def _comp_source(comp) -> Optional[cst.BaseExpression]:
    """What a comprehension iterates over, through `.items()` / `.values()`."""
    it = comp.for_in.iter
    if isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute) and it.func.attr.value in ("items", "values"):
        return it.func.value
    return it


def _flag_value(test: cst.BaseExpression, flags: dict) -> Optional[bool]:
    """The truth of an `if` test that the helper's constant-bound parameters decide (`apply_fsdp`,
    `cfg.fsdp and apply_fsdp`, `not apply_fsdp`); None when something else decides it."""
    if isinstance(test, cst.Name):
        return flags.get(test.value)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        v = _flag_value(test.expression, flags)
        return None if v is None else not v
    if isinstance(test, cst.BooleanOperation):
        left, right = _flag_value(test.left, flags), _flag_value(test.right, flags)
        if isinstance(test.operator, cst.And):
            return False if False in (left, right) else (True if left is right is True else None)
        return True if True in (left, right) else (False if left is right is False else None)
    return None


def _flag_dead(guard, flags: dict) -> bool:
    """This `if` branch cannot run for the constants the call site passes."""
    test = getattr(guard.node, "test", None)
    if test is None or guard.branch not in ("body", "orelse") or not isinstance(guard.node, cst.If):
        return False
    v = _flag_value(test, flags)
    return v is not None and v is (guard.branch == "orelse")


def _freezes_part(r: Ref, loop) -> bool:
    """Whether `for ... in X.parameters(): p.requires_grad = False` freezes a part of the model, by what it
    iterates and what its tests read, not by whether the assignment sits under an `if`: X is a submodule
    (`model.model.embed_tokens`), or an `if` in the loop reads the loop variable (`if "lora_" not in name`,
    also as `if ...: continue` before the assignment). An `if` on anything else (`if cfg.freeze_base:`)
    decides whether the whole loop runs: a full freeze, when it runs."""
    if r.child:
        return True
    names = {n.strip() for n in loop.target.replace("(", "").replace(")", "").split(",")} - {"_", ""}
    found = False

    class _Tests(cst.CSTVisitor):
        def visit_If(self, node: cst.If) -> None:
            nonlocal found
            found = found or _reads(node.test, names)

        def visit_IfExp(self, node: cst.IfExp) -> None:
            nonlocal found
            found = found or _reads(node.test, names)

    loop.node.body.visit(_Tests())
    return found


def _reads(expr: cst.CSTNode, names: set) -> bool:
    hit = False

    class _Names(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            nonlocal hit
            hit = hit or node.value in names

    expr.visit(_Names())
    return hit
