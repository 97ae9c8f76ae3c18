"""Calls into other modules of the project (see `index.py`): the callee's code runs at the call, as a
same-file helper's does, and everything that came from another file stays traceable to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import libcst as cst

from fsdplint.analysis.records import SAME_MODEL_APIS, SAME_MODEL_METHODS
from fsdplint.collect import Call, Scope
from fsdplint.resolve import dotted

# Bounds on the project view per linted file, as budgets of work rather than a fixed distance: modules
# read — those the linted file's own calls lead to (one hop) get a budget of their own, so that modules
# read on the way never crowd out a helper the file calls directly; the modules further on share one
# budget, whatever their distance (a loader chain `train -> loader -> components -> fsdp_load` costs what
# two helpers two hops away cost). Calls into a module already read cost nothing more.
_MAX_HOPS = 6  # a bound on distance only against pathological chains; the budgets decide
_MAX_MODULES = 6  # one hop away
_MAX_DEEPER_MODULES = 4  # two hops or more away, together


class Linking:
    """Mixin of `Builder`: the project's functions a call reaches, and where code of other files came from."""

    def _callee(self, call: Call, origin) -> tuple[Optional[Scope], Any]:
        """The function a call runs: a helper of the same file (of `origin`, for code of another module),
        a method of a class of the file or the project (`obj.method()`, `Cls()`), else a function of another
        module of the project that may touch the model; else (None, None)."""
        callee = self._same_file_callee(call, origin.collector if origin is not None else self.c)
        if callee is not None:
            return callee, origin
        if call.api is not None or call.func is None:
            return None, None
        inherited = call.func.startswith("self.")
        if inherited and (call.func.count(".") != 1 or not call.scope.klass):
            return None, None
        if self.project is None and origin is None and not self.c.class_bases:
            return None, None
        memo = self._callees.get(id(call))
        if memo is None:
            outer, self._volatile = getattr(self, "_volatile", False), False
            memo = self._project_callee(call, origin, inherited)
            if not self._volatile:  # not decided by the arguments of this one inlining
                self._callees[id(call)] = memo
            self._volatile = outer or self._volatile
        return memo

    def _project_callee(self, call: Call, origin, inherited: bool = False) -> tuple[Optional[Scope], Any]:
        """`inherited`: `self.method()` of a class whose own body does not define it: the method of its
        project base class (`class WanModel(ModelBase)` running `ModelBase._enable_lora(...)`)."""
        hops = self._hops.get(origin.path, 0) if origin is not None else 0
        importer = origin.path if origin is not None else self.path
        try:
            found = None
            if inherited:
                found = self._method_of((importer, call.scope.klass), call.func[5:], 0)
                if found is None:
                    return None, None
                if origin is None and found[0] == self.path:
                    return self.c.methods.get(tuple(found[1].split(".", 1))), None
            elif self.project is not None and importer is not None:
                found = self.project.resolve(importer, self._imports(origin), call.func)
            if found is None and not inherited:
                found = self._class_callee(call, origin, importer)
                if found is not None and origin is None and found[0] == self.path:
                    # A method of a class of the linted file itself.
                    return self.c.methods.get(tuple(found[1].split(".", 1))), None
            if found is None or self.project is None:
                return None, None
            if not self.project.touches(*found):
                self._known_calls.add(id(call))  # a project function that does nothing to a model
                return None, None
            path, qual = found
            if path == self.path:  # the linted file, imported back from another module
                fm, c = None, self.c
            else:
                if path not in self._hops and (hops + 1 > _MAX_HOPS or sum(
                        1 for h in self._hops.values() if (h == 1) is (hops == 0)) >= (
                        _MAX_MODULES if hops == 0 else _MAX_DEEPER_MODULES)):
                    self.unfollowed.append((call, f"{qual}() of {path.name}", found))
                    return None, None  # bounded work per linted file: further modules stay unknown
                fm = self.project.module(path, qual)
                if fm is None:
                    self.unfollowed.append((call, f"{qual}() of {path.name}", found))
                    return None, None
                c = fm.collector
        except (OSError, RecursionError):
            return None, None
        cls, _, meth = qual.rpartition(".")
        scope = c.methods.get((cls, meth)) if cls else c.functions.get(meth)
        if scope is not None and fm is not None and all(m is not fm for m in self._foreign_mods):
            self._hops.setdefault(fm.path, hops + 1)
            self._foreign_mods.append(fm)
            for s in c.scopes:
                self._origins[id(s)] = fm
        return scope, fm

    def project_class(self, call: Call) -> Optional[tuple[Any, str]]:
        """For `Cls(...)` building an instance of a class defined in this file or in another module of the
        project: (the records of the file that defines it, the class name); else None. Only read, for rules
        that follow an object into the class that keeps it: nothing of it joins the timelines."""
        name = call.func
        if name is None or call.api is not None or name.startswith("self."):
            return None
        if "." not in name and (name in self.c.class_bases or any(k == name for k, _ in self.c.methods)):
            return self.c, name
        if self.project is None or self.path is None:
            return None
        try:
            found = None
            for meth in ("__init__", "forward"):
                found = found or self.project.resolve(self.path, self._imports(None), f"{name}.{meth}")
            if found is None:
                return None
            fm = self.project.module(found[0])
        except (OSError, RecursionError):
            return None
        if fm is None:
            return None
        self.__dict__.setdefault("_class_files", {})[id(fm.collector)] = fm.path
        return fm.collector, found[1].partition(".")[0]

    def defined_in(self, collector) -> Optional[Any]:
        """The path of the other module whose records `project_class` returned (None for this file)."""
        return self.__dict__.get("_class_files", {}).get(id(collector))
    # -- methods of the project's classes ----------------------------------------------------
    def _class_callee(self, call: Call, origin, importer: Path) -> Optional[tuple[Path, str]]:
        """The method of a class of the project that a call runs: `obj.method(...)` with `obj` built by that
        class (directly or by a helper that returns it), or `Cls(...)` / `getattr(module, name)(...)` running
        the class's `__init__`. Among several candidate classes (a class picked by a name the analysis
        cannot read), the one whose method may touch a model, if only one does."""
        recv = call.receiver
        if call.method is not None and isinstance(recv, cst.Name):
            cls = self._instance_class(recv, call.scope, origin, importer, 0)
            return self._method_of(cls, call.method, 0) if cls is not None else None
        candidates = self._classes_denoted(call.node.func, call.scope, origin, importer, 0)
        found = [m for m in (self._method_of(c, "__init__", 0) for c in candidates) if m is not None]
        if len(found) > 1 and self.project is not None:
            found = [m for m in found if self.project.touches(*m)]
        return found[0] if len(found) == 1 else None

    def _method_of(self, cls: tuple, meth: str, depth: int) -> Optional[tuple]:
        """(file, "Class.method") where `meth` is defined for the class, looking through its project bases."""
        path, name = cls
        if depth > 4:
            return None
        if path == self.path:  # the linted file (None: a lone file): its own records, no fact sheet
            if (name, meth) in self.c.methods:
                return path, f"{name}.{meth}"
            bases, origin = self.c.class_bases.get(name, ()), None
        else:
            sheet = self.project.sheet(path)
            info = sheet["classes"].get(name)
            if info is None:
                return None
            if meth in info["methods"]:
                return path, f"{name}.{meth}"
            bases, origin = info["bases"], path
        for base in bases:
            b = self._resolve_class(path, None, base) if origin is None else self.project.resolve_class(
                path, self.project.sheet(path)["imports"], base)
            hit = self._method_of(b, meth, depth + 1) if b is not None and b != cls else None
            if hit is not None:
                return hit
        return None

    def _resolve_class(self, importer: Optional[Path], origin, name: str) -> Optional[tuple]:
        """(file, class) for a class name used in the linted file (origin None) or in another module."""
        if origin is None:
            if name in self.c.class_bases:
                return self.path, name
            if self.project is None or importer is None:
                return None
            if name in self.c.functions:
                return None
            return self.project.resolve_class(importer, self._imports(None), name, own=False)
        return self.project.resolve_class(importer, self._imports(origin), name)

    def _classes_denoted(self, expr, scope: Optional[Scope], origin, importer: Path, depth: int) -> list:
        """The project classes an expression names as a class object: `GPT`, `models.GPT`, a name bound to
        one, or `getattr(module, name)` (the class of that name; any class of the module when the name is
        not known)."""
        if expr is None or depth > 4:
            return []
        if isinstance(expr, cst.Call) and dotted(expr.func) == "getattr" and len(expr.args) == 2:
            if self.project is None or importer is None:
                return []
            mod = dotted(expr.args[0].value)
            path = self.project.resolve_module(importer, self._imports(origin), mod) if mod else None
            if path is None:
                return []
            classes = self.project.sheet(path)["classes"]
            name = self.value(expr.args[1].value, scope)
            if isinstance(name, str):
                return [(path, name)] if name in classes else []
            return [(path, c) for c in classes]
        d = dotted(expr)
        if d is None:
            return []
        hit = self._resolve_class(importer, origin, d)
        if hit is not None:
            return [hit]
        if "." not in d and scope is not None:
            vals = self._assignments(d, scope, origin)
            if vals is not None and len(vals) == 1:
                return self._classes_denoted(vals[0][1], vals[0][0], origin, importer, depth + 1)
        return []

    def _assignments(self, name: str, scope: Scope, origin) -> Optional[list]:
        """[(scope, value)] of the plain name in its function, else at module level; None for a parameter."""
        top = origin.collector.module_scope if origin is not None else self.c.module_scope
        for s in (scope, top) if scope is not top else (top,):
            vals = s.assigns.get(name)
            if vals:
                return [(s, v) for _, v in vals]
            if s is not top and name in s.params:
                return None
        return None

    def _instance_class(self, expr, scope: Optional[Scope], origin, importer: Path, depth: int):
        """(file, class) of the project whose instance `expr` holds, when every assignment agrees: built by
        the class, returned by a helper that builds it, or the same object again (`model = model.to(dev)`,
        `model = FSDP(model)`, which forwards attribute access to the module it wraps)."""
        if expr is None or depth > 4:
            return None
        if isinstance(expr, cst.Name):
            # What a name holds does not depend on the call that asks (the analysis is flow-insensitive).
            memo = self.__dict__.setdefault("_class_memo", {})
            key = (id(scope), expr.value, id(origin))
            if key not in memo:
                memo[key] = None  # recursion guard
                outer, self._volatile = getattr(self, "_volatile", False), False
                found = memo[key] = self._name_class(expr, scope, origin, importer, depth)
                if self._volatile:
                    del memo[key]
                self._volatile = outer or self._volatile
                return found
            return memo[key]
        if not isinstance(expr, cst.Call):
            return None
        classes = self._classes_denoted(expr.func, scope, origin, importer, depth + 1)
        if classes:
            return classes[0] if len(classes) == 1 else None
        f = dotted(expr.func)
        if f is None:
            return None
        c = origin.collector if origin is not None else self.c
        helper = c.functions.get(f) if "." not in f else None
        if helper is not None:  # a helper of the same file: the one class its returns build
            found = {self._instance_class(r, helper, origin, importer, depth + 1) for r in helper.returns}
            return found.pop() if len(found) == 1 and None not in found else None
        if self.project is None or importer is None:
            return None
        target = self.project.resolve(importer, self._imports(origin), f)
        if target is None and "." in f and f.partition(".")[0] in self.project.sheet(importer)["classes"]:
            target = (importer, f) if self.project.function(importer, f) is not None else None  # `Base.create(...)`
        fn = self.project.function(*target) if target is not None else None
        made = fn.get("made") if fn is not None else None
        if not made:
            return None
        if len(made) != 1:
            return self._registry_class(target, expr, scope)
        sheet = self.project.sheet(target[0])
        return self.project.resolve_class(target[0], sheet["imports"], made[0])

    def _registry_class(self, target: tuple, call: cst.Call, scope: Optional[Scope]):
        """A factory that builds the class a literal table maps its argument to (`loader_cls, _ =
        LOADERS[kind]; return loader_cls()`), called with a known key (`make_loader("transformer")`):
        (file, class) of that entry; None when the key, the table or the entry is not known."""
        path, qual = target
        fm = self.project.module(path, qual)
        if fm is None:
            return None
        cls, _, meth = qual.rpartition(".")
        fn = fm.collector.methods.get((cls, meth)) if cls else fm.collector.functions.get(meth)
        if fn is None or not isinstance(fn.node, cst.FunctionDef):
            return None
        built = {r.func.value for r in fn.returns if isinstance(r, cst.Call) and isinstance(r.func, cst.Name)}
        found = None
        for node in _statements(fn.node.body):
            if not (isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Subscript)):
                continue
            tgt, index = node.targets[0].target, None
            if isinstance(tgt, (cst.Tuple, cst.List)):
                names = [e.value.value if isinstance(e.value, cst.Name) else None for e in tgt.elements]
                hit = [i for i, n in enumerate(names) if n in built]
                if len(hit) != 1:
                    continue
                index = hit[0]
            elif not (isinstance(tgt, cst.Name) and tgt.value in built):
                continue
            table, sl = node.value.value, node.value.slice
            if not (isinstance(table, cst.Name) and len(sl) == 1 and isinstance(sl[0].slice, cst.Index)
                    and isinstance(sl[0].slice.value, cst.Name)):
                continue
            key = sl[0].slice.value.value
            params = fn.params[1:] if fn.params[:1] in (["self"], ["cls"]) else fn.params
            if key not in params or found is not None:
                return None
            found = (table.value, params.index(key), key, index)
        if found is None:
            return None
        table, pos, key, index = found
        at = self.call_at(call)
        value = self.value(at.arg(pos, key), scope) if at is not None else None
        bound = fn.assigns.get(table) or fm.collector.module_scope.assigns.get(table) or ()
        literal = bound[0][1] if len(bound) == 1 else None
        if not isinstance(value, str) or not isinstance(literal, cst.Dict):
            return None
        self._volatile = True  # the key came from this inlining's arguments: another one may pass another
        for el in literal.elements:
            if isinstance(el, cst.DictElement) and self.value(el.key, fn) == value:
                entry = el.value
                if index is not None:
                    if not isinstance(entry, (cst.Tuple, cst.List)) or index >= len(entry.elements):
                        return None
                    entry = entry.elements[index].value
                name = dotted(entry)
                return self.project.resolve_class(path, self.project.sheet(path)["imports"], name) if name else None
        return None

    def _name_class(self, expr: cst.Name, scope, origin, importer, depth: int):
        vals = self._assignments(expr.value, scope, origin) if scope is not None else None
        if not vals:
            return None
        found = set()
        for s, v in vals:
            if self._same_object_of(v, expr.value):
                continue
            cls = self._instance_class(v, s, origin, importer, depth + 1)
            if cls is None:
                return None
            found.add(cls)
        return found.pop() if len(found) == 1 else None

    def _same_object_of(self, value, name: str) -> bool:
        """`name.to(...)`, `FSDP(name, ...)`, `torch.compile(name)`: the object `name` already held."""
        if not isinstance(value, cst.Call):
            return False
        if isinstance(value.func, cst.Attribute) and value.func.attr.value in SAME_MODEL_METHODS:
            return dotted(value.func.value) == name
        call = self.call_at(value)
        if call is not None and call.api in SAME_MODEL_APIS:
            idx, kw = SAME_MODEL_APIS[call.api]
            return dotted(call.arg(idx, kw)) == name
        return False

    def _imports(self, origin) -> list:
        if origin is None:
            imports = self.__dict__.get("_own_imports")
            if imports is None:
                from fsdplint.analysis.index import local_imports

                imports = self.__dict__["_own_imports"] = local_imports(self.c)
            return imports
        return self.project.sheet(origin.path)["imports"]

    def argument(self, name: str, scope: Scope, _depth: int = 0) -> Optional[cst.BaseExpression]:
        """For a parameter of a helper inlined at exactly one call: what that call passes (followed through
        the caller's own bindings), so `def setup(model, policy): FSDP(model, auto_wrap_policy=policy)`
        reads the caller's policy. None when called from several places, or not passed."""
        sites = getattr(self, "_inline_sites", {}).get(id(scope))
        if not sites or len(sites) != 1 or _depth > 4:
            return None
        call = sites[0]
        params = scope.params[1:] if scope.klass and scope.params[:1] == ["self"] else scope.params
        if name not in params:
            return None
        arg = call.arg(params.index(name), name)
        if arg is None or any(a.star for a in call.node.args):
            return None
        if isinstance(arg, (cst.Name, cst.Attribute)):
            d = dotted(arg)
            inner = None
            if d is not None:
                if d in call.scope.params and call.scope.node is not None:
                    inner = self.argument(d, call.scope, _depth + 1)
                else:
                    inner = self.binding(d, call.scope)
            return inner
        return arg

    def module_scope_of(self, scope: Optional[Scope]) -> Scope:
        fm = self._origins.get(id(scope)) if scope is not None else None
        return fm.collector.module_scope if fm is not None else self.c.module_scope

    # -- code of other modules -----------------------------------------------------------
    def foreign_site(self, node: cst.CSTNode) -> Optional[tuple]:
        """For a node of another module of the project: (that module, the call in this file through which
        it runs, the function it sits in); None for a node of this file."""
        for fm in self._foreign_mods:
            unit = fm.collector.top.get(id(node))
            if unit is None:
                continue
            scope = fm.scope_of_def.get(id(unit[0])) if unit[0] != "top" else None
            site = self._scope_sites.get(id(scope)) if scope is not None else None
            if site is None:
                site = next((self._scope_sites[id(s)] for s in fm.collector.scopes if id(s) in self._scope_sites), None)
            return fm, site, scope
        return None


def _statements(block, depth: int = 0):
    """The simple statements of a block, through `if`/`for`/`while`/`with`/`try` (not nested definitions)."""
    for stmt in getattr(block, "body", ()):
        if isinstance(stmt, cst.SimpleStatementLine):
            yield from stmt.body
        elif isinstance(stmt, cst.BaseCompoundStatement) and not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            yield from _compound(stmt, depth)


def _compound(stmt, depth: int):
    if depth > 6:
        return
    yield from _statements(stmt.body, depth + 1)
    for h in getattr(stmt, "handlers", ()):
        yield from _statements(h.body, depth + 1)
    for name in ("orelse", "finalbody"):
        part = getattr(stmt, name, None)
        if isinstance(part, cst.If):
            yield from _compound(part, depth + 1)
        elif part is not None:
            yield from _statements(part.body, depth + 1)
