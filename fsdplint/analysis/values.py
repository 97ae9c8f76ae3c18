"""Constant values of expressions and keyword arguments, following simple bindings and `**kwargs` dicts."""

from __future__ import annotations

from typing import Any, Optional

import libcst as cst

from fsdplint.analysis.records import UNKNOWN, QName
from fsdplint.collect import Call, Scope
from fsdplint.resolve import dotted


class Values:
    """Mixin of `ScriptAnalysis`: what an expression evaluates to, when the file says it plainly."""

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
        top = self.module_scope_of(scope)
        for s in ([scope] if scope is not None else []) + [top]:
            vals = s.assigns.get(name)
            if vals:
                return vals[0][1] if len(vals) == 1 else None
            if s is not top and name in s.params:
                return self.argument(name, s)
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

