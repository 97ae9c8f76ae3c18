"""Calls into other modules of the project (see `index.py`): the callee's code runs at the call, as a
same-file helper's does, and everything that came from another file stays traceable to it."""

from __future__ import annotations

from typing import Any, Optional

import libcst as cst

from fsdplint.collect import Call, Scope
from fsdplint.resolve import dotted

# Bounds on the project view per linted file: modules away from it, and modules read — those the linted
# file's own calls lead to (one hop) get a budget of their own, so that modules read on the way (two hops)
# never crowd out a helper the file calls directly.
_MAX_HOPS = 2
_MAX_MODULES = 6  # one hop away
_MAX_DEEPER_MODULES = 4  # two hops away


class Linking:
    """Mixin of `Builder`: the project's functions a call reaches, and where code of other files came from."""

    def _callee(self, call: Call, origin) -> tuple[Optional[Scope], Any]:
        """The function a call runs: a helper of the same file (of `origin`, for code of another module),
        else a function of another module of the project that may touch the model; else (None, None)."""
        callee = self._same_file_callee(call, origin.collector if origin is not None else self.c)
        if callee is not None:
            return callee, origin
        if self.project is None or call.api is not None or call.func is None or call.func.startswith("self."):
            return None, None
        memo = self._callees.get(id(call))
        if memo is None:
            memo = self._callees[id(call)] = self._project_callee(call, origin)
        return memo

    def _project_callee(self, call: Call, origin) -> tuple[Optional[Scope], Any]:
        hops = self._hops.get(origin.path, 0) if origin is not None else 0
        if hops >= _MAX_HOPS:
            return None, None
        importer = origin.path if origin is not None else self.path
        if importer is None:
            return None, None
        try:
            found = self.project.resolve(importer, self._imports(origin), call.func)
            if found is None:
                return None, None
            if not self.project.touches(*found):
                self._known_calls.add(id(call))  # a project function that does nothing to a model
                return None, None
            path, qual = found
            if path == self.path:  # the linted file, imported back from another module
                fm, c = None, self.c
            else:
                if path not in self._hops and sum(1 for h in self._hops.values() if h == hops + 1) >= (
                        _MAX_MODULES if hops == 0 else _MAX_DEEPER_MODULES):
                    return None, None  # bounded work per linted file: further modules stay unknown
                fm = self.project.module(path, qual)
                if fm is None:
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
