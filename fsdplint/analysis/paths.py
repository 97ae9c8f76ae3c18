"""Which branches exclude each other, rank guards, and the call-site context of inlined helpers."""

from __future__ import annotations

import re
from functools import cached_property
from typing import Optional

import libcst as cst

from fsdplint.analysis.records import Item, Step
from fsdplint.apis import api_of
from fsdplint.collect import Call
from fsdplint.resolve import dotted


class Paths:
    """Mixin of `ScriptAnalysis`: the conditions a step runs under."""

    # -- call-site context of inlined helpers ------------------------------------------
    @cached_property
    def _calls_by_seq(self) -> dict[int, Call]:
        return {c.seq: c for c in self.c.calls}

    def site_calls(self, step: Step) -> list[Call]:
        """The call itself, then the calls of same-file helpers it was inlined through (innermost first)."""
        out = [step.call] if step.call is not None else []
        for seq in reversed(re.findall(r"@([\d.]+):", step.prefix)):
            c = self._segments.get(seq) if "." in seq else self._calls_by_seq.get(int(seq))
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
        sites = self.site_calls(step)
        items: list[Item] = [step.item] + (sites[1:] if step.call is not None else sites)
        segments = re.findall(r"[^:]+@[\d.]+:", step.prefix)
        out: list[tuple] = []
        for i, item in enumerate(items):
            if any(outer.loops or getattr(outer, "whiles", 0) for outer in items[i + 1:]):
                continue  # this helper runs in a loop: both branches of its `if`s may run
            # A class program's method prefix ("train_step:") comes before the helpers' segments.
            root = step.prefix[: step.prefix.index(segments[0])] if segments else step.prefix
            prefix = root + "".join(segments[: len(segments) - i]) if i else step.prefix
            for g in item.guards:
                test = getattr(g.node, "test", None)
                if g.branch is None or test is None or (g.loop_depth and not _loop_invariant(test, item.scope)):
                    continue
                for lit in self._literals(test, g.branch == "body"):
                    out.append(_through_parameter(prefix, lit, step.mapping) if not i and step.mapping
                               else (prefix,) + lit)
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

    def fsdp_branch(self, step: Step) -> Optional[bool]:
        """Whether the `if`s around this step (and around the calls it was inlined through) ask if FSDP is on:
        True in a branch that runs only under FSDP (`if trainer.is_fsdp_enabled:`, `if accelerator.distributed_type
        == DistributedType.FSDP:`, `if self.is_fsdp_enabled():`), False in one that runs only without it
        (`if not ...:`, `else:`), None when no test says."""
        for c in self.site_calls(step):
            for g in c.guards:
                test = getattr(g.node, "test", None)
                if test is None or g.branch is None:
                    continue
                on = _fsdp_test(test, self.code)
                if on is not None:
                    return on if g.branch == "body" else not on
        return None

    def enclosing_withs(self, step: Step) -> list[cst.BaseExpression]:
        """With-items around this step, including those around the helper calls it was inlined through."""
        return [w for c in self.site_calls(step) for w in c.withs]

    def full_state_dict_context(self, step: Step, entity: Optional[str], timeline) -> Optional[cst.Call]:
        """The `with FSDP.state_dict_type(m, StateDictType.FULL_STATE_DICT, ...)` around this step (also through
        a name, `ctx = FSDP.state_dict_type(...)`; `with ctx:`) whose module is this step's model, if any.

        FSDP1's API on the model is the script's own word that the model is FSDP1-wrapped there (by
        accelerate or the Trainer, when the file does not wrap it), and that its `state_dict()` inside the
        context all-gathers every unit (torch.distributed.fsdp.FullyShardedDataParallel.state_dict_type)."""
        if entity is None:
            return None
        segments = re.findall(r"[^:]+@[\d.]+:", step.prefix)
        root = step.prefix[: step.prefix.index(segments[0])] if segments else step.prefix
        for i, site in enumerate(self.site_calls(step) if step.call is not None else ()):
            # The names of an outer helper's `with` read in that helper's own inlined call.
            at = step if i == 0 else Step(site, root + "".join(segments[: len(segments) - i]), {})
            for w in site.withs:
                expr = w
                for _ in range(3):
                    d = dotted(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
                    if d is None:
                        break
                    expr = self.binding(d, site.scope)
                if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)
                        and expr.func.attr.value == "state_dict_type"):
                    continue
                if api_of(self.resolver.qualify(expr.func.value)) != "FSDP1":
                    continue
                args = [a for a in expr.args if a.keyword is None]
                kind = next((a.value for a in expr.args if a.keyword is not None and a.keyword.value == "state_dict_type"),
                            args[1].value if len(args) > 1 else None)
                module = next((a.value for a in expr.args if a.keyword is not None and a.keyword.value == "module"),
                              args[0].value if args else None)
                if kind is None or module is None or "FULL_STATE_DICT" not in self.code(kind):
                    continue
                r = self.ref(module, at)
                if r is not None and not r.child and timeline.find(r.key) == entity:
                    return expr
        return None


# A test whose truth is "FSDP is on": the Trainer's / a helper's flag, accelerate's distributed type, the plugin.
_FSDP_ON = re.compile(
    r"^(\w+\.)*is_fsdp_enabled(\(\))?$|^(\w+\.)*distributed_type==(\w+\.)*DistributedType\.FSDP$|"
    r"^getattr\((\w+\.)*state,[\"']fsdp_plugin[\"'],None\)isnotNone$|^(\w+\.)*state\.fsdp_pluginisnotNone$")


def _fsdp_test(test: cst.BaseExpression, code) -> Optional[bool]:
    """True when `test` holds exactly when FSDP is on, False when exactly when it is off, else None."""
    positive = True
    while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test, positive = test.expression, not positive
    text = _norm(code(test))
    if _FSDP_ON.match(text):
        return positive
    off = text.replace("!=", "==", 1) if "!=DistributedType.FSDP" in text else None
    if off is not None and _FSDP_ON.match(off):
        return not positive
    return None


_ROOT_NAME = re.compile(r"[A-Za-z_]\w*")


def _loop_invariant(test: cst.BaseExpression, scope) -> bool:
    """A test in a loop that takes the same value on every iteration: it reads only parameters of the
    function (and their attributes) that the function never assigns, and calls nothing
    (`if train_config.enable_fsdp:` inside the training loop)."""
    stack = [test]
    while stack:
        n = stack.pop()
        if isinstance(n, (cst.Call, cst.Subscript, cst.Lambda, cst.Await, cst.NamedExpr, cst.Yield)):
            return False
        if isinstance(n, cst.Attribute):
            d = dotted(n)
            if d is None or d in scope.assigns:
                return False
            stack.append(n.value)
            continue
        if isinstance(n, cst.Name):
            if n.value not in ("True", "False", "None") and (n.value not in scope.params or n.value in scope.assigns):
                return False
            continue
        stack.extend(n.children)
    return True


def _through_parameter(prefix: str, lit: tuple, mapping: dict) -> tuple:
    """A literal of a helper's test on one of its parameters (`train_config.enable_fsdp` where the caller
    passed its own `train_config`), written in the caller's terms, so it compares with the caller's tests."""
    m = _ROOT_NAME.match(lit[1])
    key = mapping.get(m.group(0)) if m is not None else None
    if key is None or m.group(0) in ("self", "cls") or key.startswith(("self.", "cls.")):
        return (prefix,) + lit
    outer, _, name = key.rpartition(":")
    if not _ROOT_NAME.fullmatch(name.split(".", 1)[0]):
        return (prefix,) + lit
    return (outer + ":" if outer else "", lit[0], name + lit[1][m.end():]) + lit[2:]


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


