"""`ScriptAnalysis`: the facts of one file that rules query (see the package docstring)."""

from __future__ import annotations

import builtins
import re
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Optional

import libcst as cst

from fsdplint.analysis.builder import Builder
from fsdplint.analysis.paths import Paths
from fsdplint.analysis.records import UNKNOWN, Event
from fsdplint.analysis.timeline import Timeline
from fsdplint.analysis.values import Values
from fsdplint.apis import api_of
from fsdplint.collect import Call, Collector, Scope, collect


_BUILTINS = frozenset(dir(builtins))
# Libraries whose calls that matter are all in apis.py: any other call of theirs is known not to do it.
_MODELLED = ("torch",)


def _string_literals(node: cst.BaseExpression) -> bool:
    """A string literal, or a tuple/list/set of them."""
    if isinstance(node, cst.SimpleString):
        return True
    if isinstance(node, (cst.Tuple, cst.List, cst.Set)):
        return bool(node.elements) and all(isinstance(e.value, cst.SimpleString) for e in node.elements)
    return False


def _fsdp_version(call: Call) -> int:
    return 1 if call.api == "FSDP1" else 2


def _is_test(scope: Scope) -> bool:
    return scope.node is not None and scope.name.startswith("test")


class _ProjectResolver:
    """The linted file's name resolution, except for nodes of other modules of the project that its
    programs run: those resolve through their own module's imports (`transformer_auto_wrap_policy`
    imported in trainers.py, not in train.py)."""

    def __init__(self, analysis: "ScriptAnalysis") -> None:
        self._a = analysis
        self._own = analysis.c.resolver

    def qualify(self, node: cst.BaseExpression):
        a = self._a
        if a._foreign_mods and id(node) not in a.c.top:
            for fm in a._foreign_mods:
                if id(node) in fm.collector.top:
                    return fm.collector.resolver.qualify(node)
        return self._own.qualify(node)

    def __getattr__(self, name: str):
        return getattr(self._own, name)


class ScriptAnalysis(Values, Paths, Builder):
    _dead: Any = frozenset()

    def __init__(self, module: cst.Module, collector: Optional[Collector] = None, env: Any = None, *,
                 project: Any = None, path: Optional[Path] = None) -> None:
        self.module = module
        self.c = collector or collect(module)
        self.resolver = _ProjectResolver(self)
        self.timelines: list[Timeline] = []
        # The project (analysis/index.py): calls to its functions in other modules run as if inlined.
        self.project = project
        self.path = path.resolve() if path is not None else None
        # Parsed command-line arguments' values (fsdplint.launch.arguments.ArgEnv): code they rule out is left out.
        self.env = env
        if project is not None and self.path is not None:
            self._qualify_through_stars()
        self._init_build_state()
        self._dead: set[int] = self._dead_items() if env is not None else set()
        self._build()

    def _qualify_through_stars(self) -> None:
        """`from common import *` where common.py imports torch or FSDP: those names are the library's here
        too, so calls through them are API calls (the collector, which sees one file, left them unknown)."""
        from fsdplint.analysis.index import STAR, local_imports

        # A collector reused from an earlier analysis (a long-lived process) first drops what that one added:
        # the star-imported module may have changed since.
        added = self.c.__dict__.pop("_star_added", None)
        if added is not None:
            names, calls = added
            for k in names:
                self.c.resolver.names.pop(k, None)
            for call in calls:
                call.qualname, call.api = None, None
        imports = [i for i in local_imports(self.c) if i[0] == STAR]
        if not imports:
            return
        try:
            names = self.project.star_library_names(self.path, imports)
        except (OSError, RecursionError):
            return
        own = set(self.c.functions) | set(self.c.class_bases)  # the file's own definitions shadow them
        fresh = {k: v for k, v in names.items() if k not in self.c.resolver.names and k not in own}
        if not fresh:
            return
        self.c.resolver.names.update(fresh)
        changed = []
        for call in self.c.calls:
            head = (call.func or "").partition(".")[0]
            if call.qualname is None and head in fresh:
                call.qualname = self.c.resolver.qualify(call.node.func)
                call.api = api_of(call.qualname)
                changed.append(call)
        self.c.__dict__["_star_added"] = (list(fresh), changed)

    # -- facts over the whole file -------------------------------------------------
    @property
    def all_calls(self) -> list[Call]:
        """The file's calls, then those of other modules of the project that its programs run."""
        return self.c.calls + self.foreign_calls if self.foreign_calls else self.c.calls

    def calls(self, *apis: str) -> list[Call]:
        # Indexed by api on first use (rebuilt if calls of other modules were added since): rules ask per
        # call site, and a scan each time is quadratic.
        calls = self.all_calls
        idx = self.__dict__.get("_calls_by_api")
        if idx is None or idx[0] != len(calls):
            by_api: dict = {}
            for i, c in enumerate(calls):
                if id(c) not in self._dead:
                    by_api.setdefault(c.api, []).append((i, c))
            idx = self.__dict__["_calls_by_api"] = (len(calls), by_api)
        hits = [x for a in dict.fromkeys(apis) for x in idx[1].get(a, ())]
        if len(apis) > 1:
            hits.sort(key=lambda x: x[0])
        return [c for _, c in hits]

    def _callees_of(self, where) -> set[str]:
        """The names of what left-out project code calls: a scope of a module that was read (its calls,
        and theirs through the project's fact sheets), or a (file, function) of the project."""
        if isinstance(where, tuple):
            return self.project.callees(*where) if self.project is not None else set()
        names = {c.func for c in where.calls if c.func}
        return names | {c.method for c in where.calls if c.method}

    def unseen(self, could: "re.Pattern[str]", effect: "Optional[re.Pattern[str]]" = None) -> list[tuple[Call, str]]:
        """Calls whose code the analysis did not read and that may do what a rule claims never happens, as
        (call, what it is): project code the bounds on the work left unread (whatever its name), and calls
        of unknown functions (an unresolved import, another library, a method of an object of unknown class)
        whose name `could` matches (`get_device`, `init_distributed` for "the CUDA device is never set").
        `effect`: the names of calls that have the effect (`set_device`, `to`): left-out project code none of
        whose calls (a few deep, by the fact sheets) has such a name cannot have it.
        A rule that proves an absence reports an error only when this is empty, else a warning naming them."""
        out: list[tuple[Call, str]] = []
        seen: set[int] = set()
        for call, what, where in self.unfollowed:
            if effect is not None and not any(effect.search(n.rpartition(".")[2]) for n in self._callees_of(where)):
                continue  # nothing it calls (a few calls deep) can have the effect
            if id(call) not in seen and id(call) not in self._dead:
                seen.add(id(call))
                out.append((call, f"{what} (left out by the bounds on the work per file)"))
        for call in self.all_calls:
            if id(call) in seen or id(call) in self._dead or id(call) in self._known_calls:
                continue
            if call.api is not None or call.func is None:
                continue
            head, _, last = call.func.rpartition(".")
            if not head and last in _BUILTINS:
                continue
            q = call.qualname or ""
            if q.split(".")[0] in _MODELLED:
                continue
            if not head and (last in self.c.functions or last in self.c.class_bases):
                continue  # a function of this file: inlined when it runs
            if could.search(last):
                seen.add(id(call))
                out.append((call, f"{call.func}()"))
        return out

    def selected_by(self, call: Call, _depth: int = 0) -> Optional[str]:
        """The test of an `if` the call runs under (itself, or at every call site of the helper that holds it)
        that picks one case by comparing a value the analysis does not know with literal strings
        (`model_name in ("nyu-visionx/cambrian-8b", ...)`, `args.mode == "qlora"`): the code runs only for
        those cases, and no launch or config that was read selects one. None otherwise."""
        for g in call.guards:
            test = getattr(g.node, "test", None)
            if g.branch != "body" or not isinstance(g.node, cst.If) or not isinstance(test, cst.Comparison):
                continue
            if len(test.comparisons) != 1:
                continue
            cmp = test.comparisons[0]
            if isinstance(test.left, cst.Name) and test.left.value == "__name__":
                continue  # `if __name__ == "__main__":` is how a script runs, not a case it picks
            if isinstance(cmp.operator, (cst.Equal, cst.In)) and _string_literals(cmp.comparator) and \
                    self.value(test.left, call.scope) is UNKNOWN:
                text = " ".join(self.code(test).split()).replace("( ", "(").replace(", )", ")")
                return text if len(text) <= 120 else text[:117] + "..."
        if _depth >= 6:
            return None
        sites = self._inline_sites.get(id(call.scope))
        if not sites:
            return None
        found = [self.selected_by(s, _depth + 1) for s in sites]
        return found[0] if all(found) else None

    def unseen_after(self, t: Timeline, event: Event, could: "re.Pattern[str]", entity: Optional[str] = None,
                     effect: "Optional[re.Pattern[str]]" = None) -> list[tuple[Call, str]]:
        """`unseen(could)` narrowed to the calls of timeline `t` after `event`, and to those that receive
        `entity` (as an argument or the receiver) when given: what could undo or redo what `event` did."""
        unseen = {id(c): (c, what) for c, what in self.unseen(could, effect)}
        out: list[tuple[Call, str]] = []
        if not unseen:
            return out
        for step in t.steps:
            hit = unseen.get(id(step.call)) if step.order > event.step.order else None
            if hit is None or hit in out:
                continue
            if entity is None:
                out.append(hit)
                continue
            exprs = [x.value for x in step.call.node.args]
            if step.call.receiver is not None:
                exprs.append(step.call.receiver)
            for x in exprs:
                r = self.ref(x, step)
                if r is not None and t.find(r.key) == entity:
                    out.append(hit)
                    break
        return out

    def method_calls(self, *methods: str) -> list[Call]:
        return [c for c in self.all_calls if c.method in methods and id(c) not in self._dead]

    def _dead_items(self) -> set[int]:
        """Ids of the calls and assignments that only run in branches the known argument values rule out."""
        out = set()
        for s in self.c.scopes:
            for item in (*s.calls, *s.attr_sets, *s.dict_sets):
                if item.guards and self.dead(item):
                    out.add(id(item))
        return out

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
            return out | self._fsdp_outside_tests(test_only)
        return out | self._fsdp_of_tests(own).get(id(call), frozenset())

    def _fsdp_outside_tests(self, test_only: set[int]) -> frozenset:
        """The FSDP versions of the calls outside tests; kept until calls of other modules are added (rules
        ask per call site, and a scan of the file's FSDP calls each time is quadratic)."""
        n = len(self.all_calls)
        got = self.__dict__.get("_fsdp_outside")
        if got is None or got[0] != n or got[1] is not test_only:
            versions = frozenset(_fsdp_version(c) for c in self.calls("FSDP1", "fully_shard") if id(c) not in test_only)
            got = self.__dict__["_fsdp_outside"] = (n, test_only, versions)
        return got[2]

    def _fsdp_of_tests(self, own: list) -> dict[int, frozenset]:
        """Id of a call inside tests -> the FSDP versions of the tests it runs in."""
        got = self.__dict__.get("_fsdp_in_tests")
        if got is None or got[0] is not own:
            by_call: dict[int, frozenset] = {}
            for ids, versions in own:
                if versions:
                    for i in ids:
                        by_call[i] = by_call.get(i, frozenset()) | versions
            got = self.__dict__["_fsdp_in_tests"] = (own, by_call)
        return got[1]

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



def analyze(module: cst.Module, *, project: Any = None, path: Optional[Path] = None) -> ScriptAnalysis:
    return ScriptAnalysis(module, project=project, path=path)
