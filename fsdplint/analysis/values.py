"""Constant values of expressions and keyword arguments, following simple bindings and `**kwargs` dicts.

`value()` gives one constant (or a `QName`, or UNKNOWN). `values()` gives the set of constants an
expression may hold: through reassignments inside `if`s, `a if c else b`, parameter defaults and
the values of parsed command-line arguments (`env`, see `fsdplint.launch.arguments`), capped at
`MAX_VALUES` (more widens to UNKNOWN). `truth()` evaluates a test to the set of its possible truth
values; a branch whose test cannot hold with the known values is dead (`dead_guard`), and the
analysis leaves its code out.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cached_property
from typing import Any, Optional

import libcst as cst

from fsdplint.analysis.records import UNKNOWN, QName
from fsdplint.collect import Call, Scope
from fsdplint.resolve import dotted


MAX_VALUES = 8


class Values:
    """Mixin of `ScriptAnalysis`: what an expression evaluates to, when the file says it plainly."""

    # The parsed command-line arguments' values (`fsdplint.launch.arguments.ArgEnv`), when the script parses any.
    env: Any = None

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
            if self._assigned_more_than_once(expr.value, scope):
                # `q = None` / `if args.quantize: q = ...`: one value when every path agrees.
                return _single(self.values(expr, scope, depth + 1))
            q = self.resolver.qualify(expr)
            return QName(q) if q else UNKNOWN
        if isinstance(expr, cst.IfExp):
            return _single(self.values(expr, scope, depth + 1))
        if isinstance(expr, cst.Attribute):
            if self.env is not None:
                hit = self.env_lookup(dotted(expr), scope)
                if hit is not None and not self._assigned_attr(dotted(expr)):
                    return hit.single
            q = self.resolver.qualify(expr)
            if q:
                return QName(q)
            d = dotted(expr)
            bound = self.binding(d, scope) if d else None
            if bound is not None:
                return self.value(bound, scope, depth + 1)
            field = self._dataclass_field(expr, scope)
            if field is not None:
                return self.value(field[0], field[1], depth + 1)
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
        if isinstance(expr, cst.Call) and dotted(expr.func) == "getattr":
            return _single(self._getattr_values(expr, scope, depth))
        if isinstance(expr, (cst.Subscript, cst.Call)) and self.env is not None and self.env.configs:
            read = self._config_read(expr, scope, depth)
            if read is not None:
                return _single(read)
        if isinstance(expr, cst.Call) and dotted(expr.func) == "dict":
            return {a.keyword.value: self.value(a.value, scope, depth + 1) for a in expr.args if a.keyword is not None}
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            v = self.value(expr.expression, scope, depth + 1)
            return -v if isinstance(v, (int, float)) else UNKNOWN
        if isinstance(expr, cst.Comparison) or (isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not)):
            # `load_in_4bit=args.bits == 4`, `not args.full_precision`: a bool when the operands are known.
            # (`a or b` is left out: it evaluates to an operand, not a bool.)
            return _single(self.truth(expr, scope, depth + 1))
        return UNKNOWN

    def env_lookup(self, d: Optional[str], scope: Optional[Scope]):
        """The parsed argument `d` (`args.use_4bit`, or a config file's `cfg.peft.q_lora`) reads: by the
        namespace's own name, or through a parameter of a helper that every call hands the namespace (or a
        part of a config, `build(cfg.peft)` with `def build(peft_params)`), by position or keyword and under
        any name (`build(model_args)` with `def build(args)`, `build(cfg=model_args)`, a chain of helpers)."""
        hit = self.env.lookup(d)
        if hit is not None or not d or "." not in d or scope is None:
            return hit
        head, attr = d.split(".", 1)
        ns = self._param_namespace(scope, head, 0)
        return self.env.lookup(f"{ns}.{attr}") if ns else None

    def config_path(self, expr: Optional[cst.BaseExpression], scope: Optional[Scope], depth: int = 0) -> Optional[str]:
        """The dotted key a read of a config file's object names, with the head resolved through helper
        parameters: `cfg.peft.q_lora`, `cfg["peft"]["q_lora"]`, `peft_params.q_lora` (`build(cfg.peft)`);
        None for other expressions."""
        if self.env is None or not self.env.configs or depth > 8:
            return None
        if isinstance(expr, cst.Name):
            if expr.value in self.env.configs:
                return expr.value
            ns = self._param_namespace(scope, expr.value, 0) if scope is not None else None
            return ns if ns and ns.split(".")[0] in self.env.configs else None
        if isinstance(expr, cst.Attribute):
            base = self.config_path(expr.value, scope, depth + 1)
            return f"{base}.{expr.attr.value}" if base else None
        if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
            key = expr.slice[0].slice.value
            if isinstance(key, cst.SimpleString) and isinstance(key.evaluated_value, str):
                base = self.config_path(expr.value, scope, depth + 1)
                return f"{base}.{key.evaluated_value}" if base else None
        return None

    def _config_read(self, expr: cst.BaseExpression, scope: Optional[Scope], depth: int) -> Optional[frozenset]:
        """The values a key read of a config object may hold (`cfg["dtype"]`, `cfg.get("dtype", "bf16")`,
        `cfg.model.get("lora", {})`); None when `expr` is no such read. A key the file lacks gives the
        `.get` default (None without one) only when the config is the file's plain mapping; else unknown."""
        if isinstance(expr, cst.Subscript):
            path = self.config_path(expr, scope)
            if path is None:
                return None
            hit = self.env.lookup(path)
            return frozenset(_hashable(v) for v in hit.values) if hit is not None else frozenset({UNKNOWN})
        if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "get"):
            return None
        base = self.config_path(expr.func.value, scope)
        args = [a for a in expr.args if not a.star]
        if base is None or not args or args[0].keyword is not None or len(args) != len(expr.args):
            return None
        key = args[0].value
        if not (isinstance(key, cst.SimpleString) and isinstance(key.evaluated_value, str)):
            return frozenset({UNKNOWN})
        path = f"{base}.{key.evaluated_value}"
        if self.env.absent(path):
            default = next((a.value for a in args[1:] if a.keyword is None or a.keyword.value == "default"), None)
            return self.values(default, scope, depth + 1) if default is not None else frozenset({None})
        hit = self.env.lookup(path)
        return frozenset(_hashable(v) for v in hit.values) if hit is not None else frozenset({UNKNOWN})

    def _param_namespace(self, scope: Scope, name: str, depth: int) -> Optional[str]:
        """The parsed namespace variable every call of `scope`'s function passes as its parameter `name`."""
        if depth > 4 or name not in scope.params or name in scope.assigns or not isinstance(scope.node, cst.FunctionDef):
            return None
        cache = self.__dict__.setdefault("_param_ns_cache", {})
        key = (id(scope), name)
        if key in cache:
            return cache[key]
        cache[key] = None  # (a recursive helper asks again while this is decided: unknown)
        found = set()
        configs = self.env.configs
        for arg, caller in self._param_arguments(scope, name):
            d = dotted(arg) if arg is not None else None
            head, _, tail = (d or "").partition(".")
            if d is None:
                found.add(None)
            elif tail:
                # A part of a config file's object (`build(cfg.peft)`): the parameter reads under that key.
                if head in configs:
                    found.add(d)
                else:
                    inner = self._param_namespace(caller, head, depth + 1) if caller is not None else None
                    found.add(f"{inner}.{tail}" if inner and inner.split(".")[0] in configs else None)
            elif d in self.env.names:
                found.add(d)
            else:
                found.add(self._param_namespace(caller, d, depth + 1) if caller is not None else None)
        out = found.pop() if len(found) == 1 else None
        cache[key] = out
        return out

    def _param_arguments(self, scope: Scope, name: str) -> list:
        """(argument expression or None, caller scope) at each call of the function whose parameter `name`
        is: the file's calls, else the one call a function of another module was inlined at. Empty when
        no call is known or one passes `*args`/`**kwargs`."""
        node = scope.node
        params = list(node.params.posonly_params) + list(node.params.params)
        index = next((i for i, p in enumerate(params) if p.name.value == name), None)
        sites = [c for c in self.c.calls if c.func == node.name.value and c.scope.klass is None and scope.klass is None]
        if not sites:
            sites = getattr(self, "_inline_sites", {}).get(id(scope), [])
            if scope.klass and scope.params[:1] == ["self"]:
                index = index - 1 if index else None
        if not sites or any(a.star for c in sites for a in c.node.args):
            return []
        return [(c.arg(index if index is not None else 10_000, name), c.scope) for c in sites]

    def _getattr_values(self, call: cst.Call, scope: Optional[Scope], depth: int) -> frozenset:
        """`getattr(torch, "bfloat16")`, `getattr(torch, args.storage_dtype)`: the dotted names a `getattr` of a
        module or class with known strings gives (`torch.bfloat16`); UNKNOWN when the object or a name is not
        known, or a default (third argument) may be taken instead."""
        args = [a for a in call.args if a.keyword is None and not a.star]
        if len(args) != 2 or len(call.args) != 2:
            return frozenset({UNKNOWN})
        owner = self.value(args[0].value, scope, depth + 1)
        if not isinstance(owner, QName):
            return frozenset({UNKNOWN})
        out = set()
        for name in self.values(args[1].value, scope, depth + 1):
            out.add(QName(f"{owner.name}.{name}") if isinstance(name, str) and name.isidentifier() else UNKNOWN)
        return _capped(out)

    def may_be_none(self, expr: Optional[cst.BaseExpression], scope: Optional[Scope], depth: int = 0) -> bool:
        """Whether `expr` may hold None on some path the known values leave open: a config object built by a
        call (`LoraConfig(...)`) is not None; `peft_config = None` then `if args.use_lora: peft_config = ...`
        may be, unless the launch decides the branch; a parameter, an attribute or another call's result is
        not known (True). Follows a tuple a helper of this file returns (`model, cfg = build(args)`)."""
        if expr is None or depth > 6:
            return True
        if isinstance(expr, cst.Name):
            if expr.value == "None":
                return True
            if expr.value in ("True", "False"):
                return False
            for s in ([scope] if scope is not None else []) + [self.c.module_scope]:
                vals = s.assigns.get(expr.value)
                if vals:
                    live = self._live_assignments(vals) if self.env is not None else vals
                    if not live:
                        return True
                    return any(self._may_be_none_bound(v, s, expr.value, depth) for _, v in live)
                if s is not self.c.module_scope and expr.value in s.params:
                    return True
            return True
        if isinstance(expr, cst.IfExp):
            t = self.truth(expr.test, scope, depth + 1)
            return ((True in t or UNKNOWN in t) and self.may_be_none(expr.body, scope, depth + 1)) or (
                (False in t or UNKNOWN in t) and self.may_be_none(expr.orelse, scope, depth + 1))
        if isinstance(expr, cst.Call):
            q = self.resolver.qualify(expr.func) or ""
            # A library class builds an object; a function (a project helper, trl's get_peft_config) may return None.
            return not q.rsplit(".", 1)[-1][:1].isupper()
        if isinstance(expr, (cst.Dict, cst.List, cst.Tuple, cst.SimpleString, cst.Integer, cst.Float)):
            return False
        return True

    def _may_be_none_bound(self, v: cst.BaseExpression, s: Scope, name: str, depth: int) -> bool:
        if isinstance(v, cst.Name) and v.value == name:
            # `cfg` unpacked from a helper's returned tuple (collect._bind binds the returned element itself):
            # read it in the helper's own scope.
            for fn in self.c.functions.values():
                for r in fn.returns:
                    if isinstance(r, cst.Tuple) and any(el.value is v for el in r.elements):
                        return self.may_be_none(v, fn, depth + 1)
            return True
        return self.may_be_none(v, s, depth + 1)

    def binding(self, name: str, scope: Optional[Scope]) -> Optional[cst.BaseExpression]:
        """The single expression bound to `name` (in `scope`, else at module level), if unique.

        Assignments in branches that cannot run are left out, and one in a branch known to run
        replaces the assignments before it."""
        top = self.module_scope_of(scope)
        for s in ([scope] if scope is not None else []) + [top]:
            vals = s.assigns.get(name)
            if vals:
                if len(vals) > 1 and self.env is not None:
                    vals = self._live_assignments(vals)
                return vals[0][1] if len(vals) == 1 else None
            if s is not top and name in s.params:
                return self.argument(name, s)
        return None

    # -- sets of values ------------------------------------------------------------------
    def values(self, expr: Optional[cst.BaseExpression], scope: Optional[Scope] = None, depth: int = 0) -> frozenset:
        """The constants `expr` may hold (UNKNOWN among them when some are not known)."""
        if expr is None or depth > 6:
            return frozenset({UNKNOWN})
        if isinstance(expr, cst.IfExp):
            t = self.truth(expr.test, scope, depth + 1)
            out: set = set()
            if True in t or UNKNOWN in t:
                out |= self.values(expr.body, scope, depth + 1)
            if False in t or UNKNOWN in t:
                out |= self.values(expr.orelse, scope, depth + 1)
            return _capped(out)
        if isinstance(expr, cst.Name) and expr.value not in ("True", "False", "None"):
            for s in ([scope] if scope is not None else []) + [self.c.module_scope]:
                vals = s.assigns.get(expr.value)
                if vals:
                    live = self._live_assignments(vals) if self.env is not None else vals
                    out = set()
                    for _, v in live:
                        out |= self.values(v, s, depth + 1)
                    return _capped(out) if out else frozenset({UNKNOWN})
                if s is not self.c.module_scope and expr.value in s.params:
                    return self._param_values(s, expr.value, depth)
        if isinstance(expr, cst.Attribute) and self.env is not None:
            d = dotted(expr)
            hit = self.env_lookup(d, scope)
            if hit is not None and not self._assigned_attr(d):
                return _capped(set(_hashable(v) for v in hit.values))
        if isinstance(expr, cst.Call) and dotted(expr.func) == "getattr":
            return self._getattr_values(expr, scope, depth)
        if isinstance(expr, (cst.Subscript, cst.Call)) and self.env is not None and self.env.configs:
            read = self._config_read(expr, scope, depth)
            if read is not None:
                return _capped(set(read))
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
            return self.truth(expr, scope, depth)
        if isinstance(expr, (cst.BooleanOperation, cst.Comparison)):
            return self.truth(expr, scope, depth)
        v = self.value(expr, scope, depth)
        return frozenset({_hashable(v)})

    def truth(self, test: cst.BaseExpression, scope: Optional[Scope] = None, depth: int = 0) -> frozenset:
        """The truth values `test` may have: a subset of {True, False, UNKNOWN}."""
        if depth > 8:
            return frozenset({UNKNOWN})
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return frozenset(UNKNOWN if t is UNKNOWN else not t for t in self.truth(test.expression, scope, depth + 1))
        if isinstance(test, cst.BooleanOperation):
            left = self.truth(test.left, scope, depth + 1)
            right = self.truth(test.right, scope, depth + 1)
            is_and = isinstance(test.operator, cst.And)
            out = set()
            for a in left:
                if a is not UNKNOWN and a is not is_and:
                    out.add(a)  # `False and ...` / `True or ...`
                    continue
                for b in right:
                    out.add(UNKNOWN if (a is UNKNOWN and b is UNKNOWN) or (a is UNKNOWN and b is is_and) else
                            b if a is not UNKNOWN else (b if b is not is_and else UNKNOWN))
            return frozenset(out)
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
            comp = test.comparisons[0]
            left = self.values(test.left, scope, depth + 1)
            right = self.values(comp.comparator, scope, depth + 1)
            if UNKNOWN in left or UNKNOWN in right or len(left) * len(right) > MAX_VALUES * 2:
                return frozenset({UNKNOWN})
            out = set()
            for a in left:
                for b in right:
                    r = _compare(comp.operator, a, b)
                    out.add(r)
            return frozenset(out)
        section = self._config_section_truth(test, scope)
        if section is not None:
            return section
        vals = self.values(test, scope, depth + 1)
        out = set()
        for v in vals:
            if v is UNKNOWN or isinstance(v, QName):
                out.add(UNKNOWN)
            else:
                try:
                    out.add(bool(v))
                except Exception:
                    out.add(UNKNOWN)
        return frozenset(out)

    def _config_section_truth(self, test: cst.BaseExpression, scope: Optional[Scope]) -> Optional[frozenset]:
        """`if cfg.peft:` on a section of a config file's object: a plain mapping is true when not empty; a
        dataclass config's section is an object, always true. None for other tests."""
        if self.env is None or not self.env.configs or not isinstance(test, (cst.Attribute, cst.Subscript)):
            return None
        path = self.config_path(test, scope)
        hit = self.env.lookup(path) if path else None
        if hit is None or not hit.values or not all(isinstance(v, dict) for v in hit.values):
            return None
        plain = self.env.configs.get(path.split(".")[0])
        return frozenset(bool(v) if plain else True for v in hit.values)

    def _reads_config(self, test: cst.BaseExpression, scope: Optional[Scope], depth: int = 0) -> bool:
        """The test reads a config file's object (directly or through a name bound to a read of one)."""
        if self.env is None or not self.env.configs or depth > 3:
            return False
        stack = [test]
        while stack:
            n = stack.pop()
            if isinstance(n, (cst.Attribute, cst.Subscript)) and self.config_path(n, scope) is not None:
                return True
            if isinstance(n, cst.Name) and n.value in self._env_locals:
                for s in ([scope] if scope is not None else []) + [self.c.module_scope]:
                    if any(self._reads_config(v, s, depth + 1) for _, v in s.assigns.get(n.value, ())):
                        return True
            stack.extend(n.children)
        return False

    def _param_values(self, scope: Scope, name: str, depth: int) -> frozenset:
        """A parameter: its default and the arguments of the file's calls to the function; UNKNOWN
        when the function is not called in the file (it may be called from elsewhere)."""
        node = scope.node
        if not isinstance(node, cst.FunctionDef):
            return frozenset({UNKNOWN})
        params = list(node.params.posonly_params) + list(node.params.params)
        index = next((i for i, p in enumerate(params) if p.name.value == name), None)
        param = next((p for p in params + list(node.params.kwonly_params) if p.name.value == name), None)
        sites = [c for c in self.c.calls if c.func == node.name.value and c.scope.klass is None and scope.klass is None]
        if not sites:
            # A function of another module (or a method) inlined at exactly one call: what that call passes.
            sites = getattr(self, "_inline_sites", {}).get(id(scope), [])
            if len(sites) != 1:
                return frozenset({UNKNOWN})
            if scope.klass and scope.params[:1] == ["self"]:
                index = index - 1 if index else None
        if not sites:
            return frozenset({UNKNOWN})
        out: set = set()
        for c in sites:
            if any(a.star for a in c.node.args):
                return frozenset({UNKNOWN})
            arg = c.arg(index if index is not None else 10_000, name)
            if arg is None:
                out |= self.values(param.default, self.c.module_scope, depth + 1) if param is not None and param.default is not None else {UNKNOWN}
            else:
                out |= self.values(arg, c.scope, depth + 1)
        return _capped(out)

    def cannot_run(self, item) -> bool:
        """An `if` around `item` whose test cannot take the value its branch needs, with the values the
        analysis knows (constants, arguments a helper is called with, defaults): `if pp_mesh is not None:`
        in a helper called with `pp_mesh=None`."""
        for g in item.guards:
            test = getattr(g.node, "test", None)
            if g.branch not in ("body", "orelse") or test is None:
                continue
            t = self.truth(test, item.scope)
            if UNKNOWN in t:
                continue
            if (g.branch == "body" and True not in t) or (g.branch == "orelse" and False not in t):
                if self.env is not None:
                    self.note_switched_off(g.node, item.scope, g.branch == "body")
                return True
        return False

    @cached_property
    def _dataclasses(self) -> dict:
        """Top-level `@dataclass` classes of the file: name -> {field: default expression}."""
        out = {}
        for stmt in self.module.body:
            if not isinstance(stmt, cst.ClassDef):
                continue
            if not any((dotted(d.decorator if not isinstance(d.decorator, cst.Call) else d.decorator.func) or "")
                       .rsplit(".", 1)[-1] == "dataclass" for d in stmt.decorators):
                continue
            fields = {}
            for line in stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else []:
                for small in getattr(line, "body", []) if isinstance(line, cst.SimpleStatementLine) else []:
                    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                        v = small.value
                        if isinstance(v, cst.Call) and (dotted(v.func) or "").rsplit(".", 1)[-1] == "field":
                            v = next((a.value for a in v.args if a.keyword is not None and a.keyword.value == "default"), None)
                        fields[small.target.value] = v
            out[stmt.name.value] = fields
        return out

    def _dataclass_field(self, expr: cst.Attribute, scope: Optional[Scope]):
        """`cfg.load_in_4bit` with `cfg = Config(...)` of a dataclass of this file: (the keyword passed,
        else the field's default; the scope to read it in)."""
        if not isinstance(expr.value, cst.Name) or not self._dataclasses:
            return None
        built = self.binding(expr.value.value, scope)
        if not isinstance(built, cst.Call) or not isinstance(built.func, cst.Name):
            return None
        fields = self._dataclasses.get(built.func.value)
        if fields is None or expr.attr.value not in fields or self._assigned_attr(dotted(expr)):
            return None
        if any(a.star for a in built.args) or any(a.keyword is None for a in built.args):
            return None
        for a in built.args:
            if a.keyword.value == expr.attr.value:
                return a.value, scope
        default = fields[expr.attr.value]
        return (default, self.c.module_scope) if default is not None else None

    def _assigned_more_than_once(self, name: str, scope: Optional[Scope]) -> bool:
        for s in ([scope] if scope is not None else []) + [self.c.module_scope]:
            vals = s.assigns.get(name)
            if vals:
                return len(vals) > 1
            if s is not self.c.module_scope and name in s.params:
                return False
        return False

    def _assigned_attr(self, d: Optional[str]) -> bool:
        """`args.x = ...` somewhere in the file: the parsed value may not be the one the code reads."""
        return d is not None and any(a.target == d for s in self.c.scopes for a in s.attr_sets)

    # -- branches the known values decide ------------------------------------------------
    @cached_property
    def _guard_truth(self) -> dict:
        return {}

    def test_truth(self, if_node: cst.CSTNode, scope: Optional[Scope]) -> Optional[frozenset]:
        """The truth values of an `if`/conditional expression test that reads a parsed argument; None
        for other tests. A branch runs only on a value the test can take with the known values: an
        unknown value (UNKNOWN) does not make a branch reachable."""
        cache = self._guard_truth
        key = id(if_node)
        if key not in cache:
            test = getattr(if_node, "test", None)
            t = self.truth(test, scope) if test is not None and self._mentions_env(test, scope) else None
            if t is not None and UNKNOWN in t and (not self._arguments_only(test, scope)
                                                   or self._reads_config(test, scope)):
                # Also reads run-time values (`step % args.every == 0`), or a config key the file does not
                # give (a dataclass config's default, a key set elsewhere): not decided by the launch.
                t = None
            cache[key] = t
        return cache[key]

    def _arguments_only(self, test: cst.BaseExpression, scope: Optional[Scope] = None) -> bool:
        """The test reads only parsed arguments (and names bound to them) and constants."""
        params = self._namespace_params(scope)
        prefixes = tuple(f"{ns}." for ns in (*self.env.names, *params))
        stack = [test]
        while stack:
            n = stack.pop()
            if isinstance(n, (cst.Subscript, cst.Call)) and self.env.configs and self._config_read(n, scope, 0) is not None:
                continue  # a key read of a config file's object (`cfg.get("x", False)`, `cfg["x"]`)
            if isinstance(n, cst.Attribute):
                d = dotted(n)
                if d is None or not d.startswith(prefixes):
                    return False
                if d.count(".") != 1 and self.config_path(n, scope) is None:
                    return False
            elif isinstance(n, cst.Name):
                if n.value not in ("True", "False", "None") and n.value not in self._env_locals:
                    return False
            elif isinstance(n, (cst.Call, cst.Subscript, cst.Lambda, cst.Await, cst.NamedExpr)):
                return False
            else:
                stack.extend(n.children)
        return True

    def _mentions_env(self, test: cst.BaseExpression, scope: Optional[Scope] = None) -> bool:
        env = self.env
        if env is None or not env.names:
            return False
        names, local = {*env.names, *self._namespace_params(scope)}, self._env_locals
        stack = [test]
        while stack:
            n = stack.pop()
            if isinstance(n, (cst.Attribute, cst.Subscript)) and isinstance(n.value, cst.Name) and n.value.value in names:
                return True
            if isinstance(n, cst.Name) and n.value in local:
                return True
            stack.extend(n.children)
        return False

    def _namespace_params(self, scope: Optional[Scope]) -> list:
        """The parameters of `scope`'s function that hold a parsed namespace (see `env_lookup`)."""
        if scope is None or self.env is None or not isinstance(scope.node, cst.FunctionDef):
            return []
        return [p for p in scope.params if p not in self.env.names and self._param_namespace(scope, p, 0)]

    @cached_property
    def _env_locals(self) -> set:
        """Plain names bound (somewhere) to a parsed argument, e.g. `use_4bit = args.load_in_4bit`."""
        out = set()
        if self.env is None:
            return out
        names = self.env.names

        def reads_argument(v) -> bool:
            while isinstance(v, (cst.UnaryOperation, cst.Comparison, cst.BooleanOperation, cst.IfExp)):
                v = v.expression if isinstance(v, cst.UnaryOperation) else v.left if not isinstance(v, cst.IfExp) else v.test
            if isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) and v.func.attr.value == "get":
                v = v.func.value  # `use_x = cfg.get("use_x", False)`
            while isinstance(v, (cst.Attribute, cst.Subscript)) and self.env.configs and not (
                    isinstance(v.value, cst.Name)):
                v = v.value  # `storage = cfg.peft.bnb_4bit_quant_storage`
            return isinstance(v, (cst.Attribute, cst.Subscript)) and isinstance(v.value, cst.Name) and v.value.value in names

        for s in self.c.scopes:
            for name, vals in s.assigns.items():
                if "." not in name and any(reads_argument(v) for _, v in vals):
                    out.add(name)
        return out

    def dead_guard(self, guard, scope: Optional[Scope]) -> bool:
        """True when the known values make this `if` branch impossible."""
        if guard.branch is None or self.env is None:
            return False
        t = self.test_truth(guard.node, scope)
        if t is None:
            return False
        dead = (True not in t) if guard.branch == "body" else (False not in t)
        if dead:
            self.note_switched_off(guard.node, scope, guard.branch == "body")
        return dead

    def dead(self, item) -> bool:
        """An item (call, attribute or subscript assignment) that only runs in an impossible branch."""
        if self.env is None:
            return False
        for g in item.guards:
            if g.branch is None and isinstance(g.node, cst.IfExp):
                node = item.node if hasattr(item, "node") else item.value
                t = self.test_truth(g.node, item.scope)
                if t is None:
                    continue
                if (True not in t and _contains(g.node.body, node)) or (False not in t and _contains(g.node.orelse, node)):
                    self.note_switched_off(g.node, item.scope, True not in t)
                    return True
            elif self.dead_guard(g, item.scope):
                return True
        return False

    @property
    def _assign_guards(self) -> dict:
        """id(assigned value) -> the (If, branch) pairs around its assignment, innermost last; for this file
        and the project's other modules its programs run (read as they are reached)."""
        cache = self.__dict__.get("_assign_guards_cache")
        if cache is None:
            cache = self.__dict__["_assign_guards_cache"] = ({}, set())
        out, walked = cache
        for m in (self.module, *(fm.module for fm in getattr(self, "_foreign_mods", ()))):
            if id(m) not in walked:
                walked.add(id(m))
                _guards_of_assignments(m, out)
        return out

    def _live_assignments(self, vals: list) -> list:
        """Assignments that can run, in order; one in a branch known to run replaces those before it."""
        guards = self._assign_guards
        live: list = []
        for seq, v in vals:
            states = []
            for node, branch in guards.get(id(v), ()):
                if branch == "loop":
                    states.append(UNKNOWN)
                    continue
                t = self._truth_at(node)
                want = branch == "body"
                if t is None:
                    states.append(UNKNOWN)
                elif want not in t:
                    states.append(None)  # this branch cannot run
                    self.note_switched_off(node, self._scope_of_if.get(id(node)), want)
                else:
                    states.append(True if t == {want} else UNKNOWN)
            if None in states:
                continue
            if states and all(x is True for x in states):
                live = [(seq, v)]
            else:
                live.append((seq, v))
        return live

    def _truth_at(self, if_node) -> Optional[frozenset]:
        # `x = None` / `if flag and x is None: x = ...`: the test reads the name whose assignments it
        # decides; asked again while deciding it, the answer is unknown (not an endless recursion).
        busy = self.__dict__.setdefault("_truth_busy", set())
        if id(if_node) in busy:
            return None
        busy.add(id(if_node))
        try:
            scope = self._scope_of_if.get(id(if_node))
            return self.test_truth(if_node, scope)
        finally:
            busy.discard(id(if_node))

    @cached_property
    def _scope_of_if(self) -> dict:
        out = {}
        for call in self.c.calls:
            for g in call.guards:
                out.setdefault(id(g.node), call.scope)
        for s in self.c.scopes:
            for a in s.attr_sets + s.dict_sets:
                for g in a.guards:
                    out.setdefault(id(g.node), s)
        return out

    # -- opt-in flags: options a user passes to switch a feature on ------------------------
    def switches(self, test: Optional[cst.BaseExpression], scope: Optional[Scope] = None) -> set:
        """Option strings of the opt-in flags a test reads (directly or through a name bound to one,
        `use_fsdp = args.use_fsdp == "True"`) that this run leaves at their default or frees."""
        env = self.env
        if env is None or test is None:
            return set()
        cache = self.__dict__.setdefault("_switch_cache", {})
        if (id(test), id(scope)) in cache:
            return cache[(id(test), id(scope))]
        out: set = set()
        cache[(id(test), id(scope))] = out
        names = {*env.names, *self._namespace_params(scope)}
        stack, seen = [test], set()
        while stack:
            n = stack.pop()
            if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value in names:
                hit = self.env_lookup(dotted(n), scope)
                if hit is not None and hit.switch:
                    out.add(hit.switch)
                continue
            if isinstance(n, cst.Name) and n.value in self._env_locals and n.value not in seen:
                seen.add(n.value)
                for s in self.c.scopes:
                    stack.extend(v for _, v in s.assigns.get(n.value, ()))
                continue
            stack.extend(n.children)
        return out

    def opened_by_switch(self, test: cst.BaseExpression, scope: Optional[Scope], holds: bool) -> bool:
        """The test takes `holds` once an opt-in flag it reads, freed for this run, is passed."""
        free = [x for x in self.switches(test, scope) if len(self._switch_values(x)) > 1]
        return bool(free) and holds in self.truth(test, scope)

    def switched_truth(self, if_node: cst.CSTNode, scope: Optional[Scope], pins: dict) -> Optional[frozenset]:
        """`test_truth` with some opt-in flags pinned: option string -> the values it may hold."""
        # The env's own types, copied (`dataclasses.replace`): the analysis reads the arguments' values but
        # sits below the module that parses them.
        env = self.env
        names = {}
        for ns, group in env.names.items():
            names[ns] = {k: (replace(v, values=pins[v.switch]) if v.switch in pins else v)
                         for k, v in group.items()}
        saved = (self.__dict__.get("_guard_truth"), self.__dict__.get("_truth_busy"))
        self.env = replace(env, names=names)
        self.__dict__["_guard_truth"], self.__dict__["_truth_busy"] = {}, set()
        try:
            return self.test_truth(if_node, scope)
        finally:
            self.env = env
            for key, old in zip(("_guard_truth", "_truth_busy"), saved):
                if old is None:
                    self.__dict__.pop(key, None)
                else:
                    self.__dict__[key] = old

    def note_switched_off(self, if_node: cst.CSTNode, scope: Optional[Scope], want: bool) -> None:
        """Remember the opt-in flags left at their default that make this branch impossible (the branch
        runs once they may be passed): the file is then linted once more with them free."""
        if self.__dict__.get("_pinning"):
            return
        key = (id(if_node), want)
        done = self.__dict__.setdefault("_switch_noted", set())
        if key in done:
            return
        done.add(key)
        sw = {x for x in self.switches(getattr(if_node, "test", None), scope) if len(self._switch_values(x)) == 1}
        if not sw:
            return
        self.__dict__["_pinning"] = True
        try:
            t = self.switched_truth(if_node, scope, {x: self._switch_values(x) + (self._switch_on(x),) for x in sw})
        finally:
            self.__dict__["_pinning"] = False
        if t is not None and want in t:
            self.__dict__.setdefault("switched_off", set()).update(sw)

    def _switch_values(self, switch: str) -> tuple:
        for group in self.env.names.values():
            for v in group.values():
                if v.switch == switch:
                    return v.values
        return ()

    def _switch_on(self, switch: str):
        """The value passing the flag gives (the field's own `Field.switch`)."""
        return self.env.switches.get(switch, True)

    def env_conditions(self) -> list[tuple]:
        """(If node, branch, test text, truth set) of each `if` whose test reads a parsed argument."""
        out = []
        seen = set()
        for node in list(self._scope_of_if_all):
            if id(node) in seen:
                continue
            seen.add(id(node))
            t = self._truth_at(node)
            if t is None:
                continue
            out.append((node, self.code(node.test).strip(), t))
        return out

    @cached_property
    def _scope_of_if_all(self) -> list:
        nodes = []

        def walk(body):
            for stmt in body:
                if isinstance(stmt, cst.If):
                    nodes.append(stmt)
                    walk(stmt.body.body)
                    orelse = stmt.orelse
                    if isinstance(orelse, cst.If):
                        walk([orelse])
                    elif isinstance(orelse, cst.Else):
                        walk(orelse.body.body)
                elif isinstance(stmt, (cst.For, cst.While, cst.With, cst.Try, cst.FunctionDef, cst.ClassDef)):
                    if isinstance(stmt.body, cst.IndentedBlock):
                        walk(stmt.body.body)
                    if isinstance(stmt, cst.Try):
                        for h in stmt.handlers:
                            if isinstance(h.body, cst.IndentedBlock):
                                walk(h.body.body)

        walk(self.module.body)
        return nodes

    def value_conditions(self, expr: Optional[cst.BaseExpression], scope: Optional[Scope], wanted,
                         depth: int = 0) -> Optional[list[tuple[cst.BaseExpression, bool]]]:
        """The `if` tests under which `expr` holds a value that `wanted(value)` accepts, as (test, holds)
        pairs: `device_map = None` / `if args.quantize: device_map = "auto"` gives [(args.quantize, True)].
        None when no path gives such a value, or when the paths cannot be told (an assignment in a loop, a
        later reassignment under nested `if`s); [] when it holds on every path."""
        if expr is None or depth > 4:
            return None
        if isinstance(expr, cst.IfExp):
            t = self.truth(expr.test, scope, depth + 1)
            for branch, holds in ((expr.body, True), (expr.orelse, False)):
                if holds in t or UNKNOWN in t:
                    sub = self.value_conditions(branch, scope, wanted, depth + 1)
                    if sub is not None:
                        return ([] if t == {holds} else [(expr.test, holds)]) + sub
            return None
        if not isinstance(expr, cst.Name) or expr.value in ("True", "False", "None"):
            return None if not any(_accepts(wanted, v) for v in self.values(expr, scope, depth + 1)) else []
        for s in ([scope] if scope is not None else []) + [self.c.module_scope]:
            vals = s.assigns.get(expr.value)
            if not vals:
                if s is not self.c.module_scope and expr.value in s.params:
                    return [] if any(_accepts(wanted, v) for v in self._param_values(s, expr.value, depth)) else None
                continue
            live = self._live_assignments(vals) if self.env is not None else vals
            body = s.node if isinstance(s.node, cst.FunctionDef) else (self.module if s is self.c.module_scope else None)
            if body is None:
                return None
            for i, (_, v) in enumerate(live):
                inner = self.value_conditions(v, s, wanted, depth + 1) if isinstance(v, cst.IfExp) else (
                    [] if any(_accepts(wanted, x) for x in self.values(v, s, depth + 1)) else None)
                if inner is None:
                    continue
                path = _if_path(body, v)
                if path is None:
                    return None
                out = [(node.test, branch == "body") for node, branch in path] + inner
                for _, later in live[i + 1:]:
                    # A later assignment replaces the value on its own path: the value holds when that path is not taken.
                    lpath = _if_path(body, later)
                    if lpath is None or len(lpath) != 1 or any(_accepts(wanted, x) for x in self.values(later, s, depth + 1)):
                        return None
                    node, branch = lpath[0]
                    out.append((node.test, branch != "body"))
                return out
            return None
        return None

    def dict_entries(self, expr: Optional[cst.BaseExpression], scope: Optional[Scope],
                     before: Optional[int] = None, choices: Optional[list] = None) -> Optional[dict]:
        """key -> the expression a dict holds for it where it is used (before the item numbered `before`): the
        dict literal or `dict(...)` the name is bound to, then each later `d[key] = v`, `d.update(key=v)` and
        `d.update({...})` in the order written. A write that may not run (under an `if` the known values do
        not decide, in a loop) gives its value to a key that had none and makes one that had another UNKNOWN;
        one that cannot run is left out. None when the dict is not known (nor a write to keys the file does
        not spell)."""
        bound, name = expr, None
        for _ in range(3):
            if not isinstance(bound, cst.Name):
                break
            name, nxt = bound.value, self.binding(bound.value, scope)
            if nxt is None:
                break
            bound = nxt
        out: dict = {}
        if isinstance(bound, cst.Dict):
            for el in bound.elements:
                k = self.value(el.key, scope) if isinstance(el, cst.DictElement) else UNKNOWN
                if not isinstance(k, str):
                    return None
                out[k] = el.value
        elif isinstance(bound, cst.Call) and dotted(bound.func) == "dict" and all(a.keyword for a in bound.args):
            out.update({a.keyword.value: a.value for a in bound.args})
        else:
            return None
        if name is None or bound is expr:
            return out
        owner = next((x for x in ([scope] if scope is not None else []) + [self.c.module_scope]
                      if name in x.assigns), None)
        if owner is None:
            return out
        writes = [(ds.seq, ds, [(ds.key, ds.value)] if ds.key is not None else None) for ds in owner.dict_sets
                  if ds.target == name]
        for c in owner.calls:
            if c.method == "update" and dotted(c.receiver) == name:
                pairs = []
                for arg in c.node.args:
                    if arg.keyword is not None:
                        pairs.append((arg.keyword.value, arg.value))
                    elif isinstance(arg.value, cst.Dict) and not arg.star and all(
                            isinstance(e, cst.DictElement) and isinstance(self.value(e.key, owner), str)
                            for e in arg.value.elements):
                        pairs += [(self.value(e.key, owner), e.value) for e in arg.value.elements]
                    else:
                        pairs = None
                        break
                writes.append((c.seq, c, pairs))
        for seq, item, pairs in sorted(writes, key=lambda w: w[0]):
            if before is not None and seq >= before or self.cannot_run(item):
                continue
            sure = not item.loops and all(
                self.truth(g.node.test, item.scope) == {g.branch == "body"} for g in item.guards
                if g.branch in ("body", "orelse") and getattr(g.node, "test", None) is not None) and not any(
                g.branch not in ("body", "orelse") for g in item.guards)
            if pairs is None:  # `d[key] = v` / `d.update(f())` with keys the file does not spell: any key
                return None
            if not sure and choices is not None:
                choices.append((item, pairs))  # (for `keyword_paths`: the dict with and without this write)
            for k, v in pairs:
                # A write that may run: the value when the key had none (the only one it can hold, as a
                # keyword written under the same `if`), unknown when it may replace another.
                out[k] = v if sure or k not in out or (out[k] is not UNKNOWN and self.value(out[k], owner) == self.value(
                    v, owner) is not UNKNOWN) else UNKNOWN
        return out

    def keyword_paths(self, call: Call) -> Optional[list[tuple[dict, list]]]:
        """The keywords a call gets on each path when its one `**d` dict differs by path: `d` built in
        exclusive branches (`if c: d = dict(...)` / `else: d = dict(...)`), or a `d[key] = v` / `d.update(...)`
        under an `if` the known values do not decide (with it and without it). Each path: (keyword -> its
        expression, the (test, holds) pairs that take it). None when the dict is the same on every path or
        the paths cannot be told (a loop, several undecided writes, a dict the file does not spell)."""
        stars = call.star_kwargs()
        if len(stars) != 1 or not isinstance(stars[0], cst.Name):
            return None
        name = stars[0].value
        direct = {a.keyword.value: a.value for a in call.node.args if a.keyword is not None}
        owner = next((x for x in ([call.scope] if call.scope is not None else []) + [self.c.module_scope]
                      if name in x.assigns), None)
        if owner is None:
            return None
        body = owner.node if isinstance(owner.node, cst.FunctionDef) else (
            self.module if owner is self.c.module_scope else None)
        vals = owner.assigns[name]
        live = self._live_assignments(vals) if self.env is not None else vals
        live = [(seq, v) for seq, v in live if call.scope is not owner or seq < call.seq]
        if body is None or not live:
            return None
        paths = []
        if len(live) > 1:
            if any(ds.target == name for ds in owner.dict_sets) or any(
                    c.method == "update" and dotted(c.receiver) == name for c in owner.calls):
                return None  # branches and writes together: not told apart
            for _, v in live:
                entries = self.dict_entries(v, owner)
                where = _if_path(body, v)
                if entries is None or not where:
                    return None
                paths.append(({**entries, **direct}, [(node.test, branch == "body") for node, branch in where]))
            return paths
        choices: list = []
        entries = self.dict_entries(stars[0], call.scope, call.seq, choices=choices)
        if entries is None or len(choices) != 1:
            return None
        item, pairs = choices[0]
        tests = [(g.node.test, g.branch == "body") for g in item.guards
                 if g.branch in ("body", "orelse") and getattr(g.node, "test", None) is not None]
        if item.loops or len(tests) != 1 or any(g.branch not in ("body", "orelse") for g in item.guards):
            return None
        test, holds = tests[0]
        without = dict(entries)
        base = self.dict_entries(stars[0], call.scope, item.seq)
        for k, _ in pairs:
            if base is not None and k in base:
                without[k] = base[k]
            else:
                without.pop(k, None)
        with_it = {**entries, **dict(pairs)}
        return [({**without, **direct}, [(test, not holds)]), ({**with_it, **direct}, [(test, holds)])]

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
        call = self.c._by_node.get(id(node))
        if call is None:
            for fm in self._foreign_mods:  # code of another module of the project, inlined here
                call = fm.collector._by_node.get(id(node))
                if call is not None:
                    break
        return call

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def keyword(self, call: Call, name: str) -> Any:
        """The expression passed as `name=`, also through `**d` with `d = dict(...)`/`{...}`; None if absent,
        UNKNOWN if an unresolved `**kwargs` may hold it."""
        direct = call.kw(name)
        if direct is not None:
            return direct
        hidden = False
        for star in call.star_kwargs():
            entries = self.dict_entries(star, call.scope, call.seq) if isinstance(star, cst.Name) else None
            if entries is not None:
                # The dict where the call reads it: its literal with the writes before the call applied.
                if name in entries:
                    return entries[name]
                continue
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
                # `kwargs.update(name=v)` / `kwargs.update({"name": v})`; an update the file does not spell out
                # may hold it.
                for c in call.scope.calls:
                    if c.method != "update" or dotted(c.receiver) != star.value or c.seq >= call.seq:
                        continue
                    for arg in c.node.args:
                        if arg.keyword is not None and arg.keyword.value == name:
                            return arg.value
                        if arg.keyword is None and isinstance(arg.value, cst.Dict) and arg.star == "":
                            for e in arg.value.elements:
                                if not isinstance(e, cst.DictElement) or not isinstance(e.key, cst.SimpleString):
                                    hidden = True
                                elif e.key.evaluated_value == name:
                                    return e.value
                        elif arg.keyword is None:
                            hidden = True
        return UNKNOWN if hidden else None



def _accepts(wanted, v: Any) -> bool:
    try:
        return v is not UNKNOWN and bool(wanted(v))
    except Exception:
        return False


def _if_path(root: cst.CSTNode, value: cst.BaseExpression) -> Optional[list[tuple[cst.If, str]]]:
    """The (If, branch) pairs around the assignment of `value` in `root` (a function or module), outermost
    first; None when it is not found or sits in a loop, `with`, `try` or nested function (paths not told)."""
    def walk(body, stack):
        for stmt in body:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None and (
                            small.value is value or (isinstance(small.value, (cst.Tuple, cst.List)) and any(
                                e.value is value for e in small.value.elements))):  # `a, b = None, None`
                        return stack
            elif isinstance(stmt, cst.If):
                hit = walk(stmt.body.body, stack + [(stmt, "body")])
                if hit is not None:
                    return hit
                orelse = stmt.orelse
                if isinstance(orelse, cst.If):
                    hit = walk([orelse], stack + [(stmt, "orelse")])
                elif isinstance(orelse, cst.Else):
                    hit = walk(orelse.body.body, stack + [(stmt, "orelse")])
                if hit is not None:
                    return hit
        return None

    body = root.body.body if isinstance(root, cst.FunctionDef) and isinstance(root.body, cst.IndentedBlock) else (
        root.body if isinstance(root, cst.Module) else [])
    return walk(body, [])


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return UNKNOWN
    return v


def _capped(values: set) -> frozenset:
    return frozenset(values) if len(values) <= MAX_VALUES else frozenset({UNKNOWN})


def _compare(op: cst.BaseCompOp, a: Any, b: Any) -> Any:
    try:
        if isinstance(op, (cst.Equal, cst.Is)):
            return a == b
        if isinstance(op, (cst.NotEqual, cst.IsNot)):
            return a != b
        if isinstance(op, cst.In):
            return a in b
        if isinstance(op, cst.NotIn):
            return a not in b
        if isinstance(op, cst.LessThan):
            return a < b
        if isinstance(op, cst.LessThanEqual):
            return a <= b
        if isinstance(op, cst.GreaterThan):
            return a > b
        if isinstance(op, cst.GreaterThanEqual):
            return a >= b
    except TypeError:
        return UNKNOWN
    return UNKNOWN



def _contains(tree: cst.CSTNode, node: cst.CSTNode) -> bool:
    stack = [tree]
    while stack:
        n = stack.pop()
        if n is node:
            return True
        stack.extend(n.children)
    return False


def _single(values: frozenset) -> Any:
    if len(values) == 1:
        (v,) = values
        return v
    return UNKNOWN


def _guards_of_assignments(module: cst.Module, out: dict) -> None:
    """id(assigned value) -> the (If, branch) pairs around its assignment, for one module."""

    def walk(body, stack):
        for stmt in body:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None:
                        out[id(small.value)] = tuple(stack)
            elif isinstance(stmt, cst.If):
                walk(stmt.body.body, stack + [(stmt, "body")])
                orelse = stmt.orelse
                if isinstance(orelse, cst.If):
                    walk([orelse], stack + [(stmt, "orelse")])
                elif isinstance(orelse, cst.Else):
                    walk(orelse.body.body, stack + [(stmt, "orelse")])
            elif isinstance(stmt, (cst.For, cst.While)):
                walk(stmt.body.body, stack + [(stmt, "loop")])
            elif isinstance(stmt, (cst.With, cst.Try, cst.FunctionDef, cst.ClassDef)):
                inner = stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else []
                walk(inner, [] if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else stack)
                if isinstance(stmt, cst.Try):
                    for h in stmt.handlers:
                        walk(h.body.body if isinstance(h.body, cst.IndentedBlock) else [], stack)

    walk(module.body, [])
