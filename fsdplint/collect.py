"""One visit per file: collect the calls, bindings and control context the analysis needs.

Nothing here interprets FSDP semantics; `analysis.py` builds the model timeline
from these records. Positions are not computed here (see `positions.py`).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from typing import Optional

import libcst as cst

from fsdplint.apis import QUALIFIED, api_of
from fsdplint.resolve import Resolver, dotted

# A rank expression: `rank`, `local_rank`, `dist.get_rank()`, `int(os.environ["RANK"])`, `args.rank`.
_RANK = r"""\w*(?i:rank)\w*(?:\(\))?["'\]\)]*"""
# Patterns as strings: `re` compiles them on first use (and caches them), only for files with such guards.
_RANK0 = (
    rf"(\b{_RANK}\s*(==|<=|<)\s*[01]\b)|(\b0\s*==\s*{_RANK})|(\b{_RANK}\s+in\s*[\[(]\s*-?[01]\s*,\s*-?[01]\s*[\])])|"
    r"^\s*not\s+[\w.]*(?i:rank)\w*(\(\))?\s*$|is_main_process|is_local_main_process|"
    r"is_world_process_zero|process_index\s*==\s*0|is_master|master_process|rank_zero|is_rank_?0|\brank0\b|"
    # `self.is_main` / `is_main_rank()` whose definition the file does not show (a base class elsewhere)
    r"\bis_main(_rank)?\b"
)
_NOT_RANK0 = (
    rf"\b{_RANK}\s*(!=|>|>=)\s*[01]\b|not\s+[\w.]*(is_main_process|is_world_process_zero|is_master|is_main\b)"
)
_VERSION = r"(?i)version|__version__|is_torch_\w+|TORCH_\w*VERSION|\bhasattr\b|inspect\.signature|find_spec"
_CALLED_HELPER = re.compile(r"(?<![\w.])([A-Za-z_]\w*)\(\s*\)")
_SELF_ATTR = re.compile(r"\bself\.([A-Za-z_]\w*)\b(?!\s*\()")
_SELF_CALL = re.compile(r"\bself\.([A-Za-z_]\w*)\(\s*\)")
# `try: ... except ImportError:` makes an import inside optional.
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException", "AttributeError"})


class Guard:
    """An `if`/`try` around a call. Its kind ("rank0", "not_rank0", "version", "import_error" — a try
    body that catches ImportError —, "other") is worked out from the test's source on first use:
    most guards are never asked, and rendering every test costs a codegen each."""

    __slots__ = ("node", "text", "branch", "loop_depth", "_kind", "_resolve", "caught")

    def __init__(self, kind, node, text="", branch=None, loop_depth=0, resolve=None, caught=frozenset()) -> None:
        self._kind = kind
        self._resolve = resolve
        self.node = node
        self.text = text
        # For a `try` body: the exception names its handlers catch (e.g. {"ImportError", "TypeError"}).
        self.caught = caught
        # Which branch of the `if` holds the code ("body" / "orelse"; None for a conditional expression), and
        # how many loops of the same function enclose the `if` (branches of an `if` in a loop can both run).
        self.branch = branch
        self.loop_depth = loop_depth

    @property
    def kind(self) -> str:
        if self._kind is None:
            self._kind = self._resolve()
            self._resolve = None
        return self._kind

    def __repr__(self) -> str:
        return f"Guard({self.kind!r}, branch={self.branch!r})"


@dataclass(frozen=True)
class Loop:
    target: str  # dotted loop variable(s), comma-joined
    iter: cst.BaseExpression
    node: cst.CSTNode


@dataclass(slots=True)
class Stmt:
    node: cst.CSTNode
    block: cst.CSTNode  # Module, IndentedBlock or SimpleStatementSuite holding it
    index: int


@dataclass
class Scope:
    name: str
    node: Optional[cst.CSTNode]
    params: list[str] = field(default_factory=list)
    klass: Optional[str] = None
    decorators: list[str] = field(default_factory=list)
    calls: list["Call"] = field(default_factory=list)
    assigns: dict[str, list[tuple[int, cst.BaseExpression]]] = field(default_factory=dict)
    attr_sets: list["AttrSet"] = field(default_factory=list)
    dict_sets: list["AttrSet"] = field(default_factory=list)
    returns: list[cst.BaseExpression] = field(default_factory=list)
    annotations: dict[str, cst.BaseExpression] = field(default_factory=dict)  # parameter -> annotation
    aliases: list["AttrSet"] = field(default_factory=list)  # `net = model`: a second name (target without a dot)


@dataclass(slots=True)
class Call:
    node: cst.Call
    seq: int
    qualname: Optional[str]
    api: Optional[str]
    func: Optional[str]  # dotted callee as written
    method: Optional[str]
    receiver: Optional[cst.BaseExpression]
    stmt: Optional[Stmt]
    scope: Scope
    guards: tuple[Guard, ...]
    loops: tuple[Loop, ...]
    withs: tuple[cst.BaseExpression, ...]
    targets: list[cst.BaseExpression] = field(default_factory=list)
    whiles: int = 0  # `while` loops around the call in its function (`loops` holds the `for` loops)

    def arg(self, index: int, keyword: Optional[str] = None) -> Optional[cst.BaseExpression]:
        if keyword is not None:
            kw = self.kw(keyword)
            if kw is not None:
                return kw
        pos = [a for a in self.node.args if a.keyword is None and not a.star]
        return pos[index].value if index < len(pos) else None

    def kw(self, name: str) -> Optional[cst.BaseExpression]:
        for a in self.node.args:
            if a.keyword is not None and a.keyword.value == name:
                return a.value
        return None

    def kwarg(self, name: str) -> Optional[cst.Arg]:
        for a in self.node.args:
            if a.keyword is not None and a.keyword.value == name:
                return a
        return None

    def star_kwargs(self) -> list[cst.BaseExpression]:
        return [a.value for a in self.node.args if a.star == "**"]

    @property
    def rank_guarded(self) -> bool:
        return any(g.kind in ("rank0", "not_rank0") for g in self.guards) or self.scope_rank0

    @property
    def version_guarded(self) -> bool:
        return any(g.kind == "version" for g in self.guards)

    @property
    def scope_rank0(self) -> bool:
        return any("rank_zero" in d or "main_process" in d for d in self.scope.decorators)


@dataclass(slots=True)
class AttrSet:
    target: str  # dotted target, e.g. "model.config.use_cache" or dict name for subscripts
    key: Optional[str]
    value: cst.BaseExpression
    seq: int
    stmt: Optional[Stmt]
    scope: Scope
    guards: tuple[Guard, ...]
    loops: tuple[Loop, ...]


class Collector(cst.CSTVisitor):
    """Records calls in evaluation order (post-order), with guards, loops and scopes."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.resolver = Resolver()
        self.module_scope = Scope("<module>", None)
        self.scopes: list[Scope] = [self.module_scope]
        self.functions: dict[str, Scope] = {}
        self.methods: dict[tuple[str, str], Scope] = {}
        # Functions defined inside another function, by (id of the enclosing scope, name).
        self.nested: dict[tuple[int, str], Scope] = {}
        self.enclosing: dict[int, Scope] = {}  # id(scope of a nested function) -> the function it is defined in
        self.class_bases: dict[str, tuple[str, ...]] = {}
        self.calls: list[Call] = []
        self.import_froms: list[tuple[cst.ImportFrom, tuple[Guard, ...]]] = []
        # Version gates that refuse old releases before a scope's code runs (see `_apply_gates`):
        # (scope, seq, the `if`/`assert`/call that raises), and the scope of each ImportFrom.
        self.gates: list[tuple[Scope, int, cst.CSTNode]] = []
        self._import_scopes: dict[int, tuple[Scope, int]] = {}
        # node id -> the unit positions render to locate it: ("top", i) for the i-th top-level
        # statement, or (FunctionDef, indent tokens, i) for the innermost function.
        self.top: dict[int, tuple] = {}
        self._unit: tuple = ("top", -1)
        self._units: list[tuple] = []
        self._indent: list[str] = []
        self._by_node: dict[int, Call] = {}
        self._scope_stack: list[Scope] = [self.module_scope]
        self._class_stack: list[str] = []
        self._guards: list[Guard] = []
        self._loops: list[Loop] = []
        self._withs: list[cst.BaseExpression] = []
        self._blocks: list[list] = [[module, -1]]
        self._stmt: list[Stmt] = []
        self._elifs: set[int] = set()
        self._seq = 0
        self._if_kinds: dict[int, str] = {}
        self._early_exits: dict[int, int] = {}  # id(block) -> guards of `if ...: return` to pop with the block
        self._whiles = 0  # `while` loops around the current statement (in the current function)

    # -- helpers -------------------------------------------------------------------
    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _enter_stmt(self, node: cst.CSTNode) -> None:
        if id(node) in self._elifs:
            return
        if len(self._blocks) == 1:
            self._unit = ("top", self._blocks[0][1] + 1)
        top = self._blocks[-1]
        top[1] += 1
        self._stmt.append(Stmt(node, top[0], top[1]))

    def _leave_stmt(self, node: cst.CSTNode) -> None:
        if id(node) in self._elifs:
            return
        self._stmt.pop()

    def _text(self, node: cst.CSTNode) -> str:
        try:
            return self.module.code_for_node(node)
        except Exception:  # pragma: no cover - codegen of a detached node
            return ""

    def _guard_kind(self, test: cst.BaseExpression, scopes) -> str:
        text = self._with_bindings(self._text(test), scopes)
        if re.search(_NOT_RANK0, text):
            return "not_rank0"
        if re.search(_RANK0, text):
            return "rank0"
        if re.search(_VERSION, text):
            return "version"
        return "other"

    def _with_bindings(self, text: str, scopes) -> str:
        """The test with each plain name replaced by what it was last assigned, so
        `r = dist.get_rank()` ... `if r == 0:` reads as a rank check whatever the name; a property
        (`self.is_chief`) or a helper without arguments (`is_chief()`) reads as what it returns."""
        for _ in range(2):  # (a property that returns another property, or a helper's rank test)
            if "(" not in text and "self." not in text:
                break
            before = text
            text = _CALLED_HELPER.sub(lambda m: self._returned(self.functions.get(m.group(1))) or m.group(0), text)
            text = _SELF_CALL.sub(lambda m: self._returned(self._method(m.group(1))) or m.group(0), text)
            text = _SELF_ATTR.sub(lambda m: self._returned(self._property(m.group(1))) or m.group(0), text)
            if text == before:
                break
        values = {}
        for name in set(re.findall(r"(?<![\w.])[A-Za-z_]\w*", text)):
            for scope in scopes:
                vals = scope.assigns.get(name)
                if vals:
                    values[name] = self._text(vals[-1][1])
                    break
        if not values:
            return text
        return re.sub(r"(?<![\w.])[A-Za-z_]\w*", lambda m: f"({values[m.group(0)]})" if m.group(0) in values else m.group(0), text)

    def _method(self, name: str) -> Optional[Scope]:
        """`self.name()`: the method of that name, when one class of the file defines it."""
        found = [scope for (_, meth), scope in self.methods.items() if meth == name and "property" not in scope.decorators]
        return found[0] if len(found) == 1 else None

    def _property(self, name: str) -> Optional[Scope]:
        for (_, meth), scope in self.methods.items():
            if meth == name and "property" in scope.decorators:
                return scope
        return None

    def _returned(self, scope: Optional[Scope]) -> Optional[str]:
        """The text of what a helper without parameters (or a property) returns, if it returns one thing."""
        if scope is None or len(scope.returns) != 1 or len([p for p in scope.params if p != "self"]):
            return None
        return f"({self._text(scope.returns[0])})"

    # -- blocks & statements -------------------------------------------------------
    def visit_IndentedBlock(self, node) -> None:
        self._blocks.append([node, -1])
        self._indent.append(node.indent if node.indent is not None else self.module.default_indent)

    def leave_IndentedBlock(self, node) -> None:
        for _ in range(self._early_exits.pop(id(node), 0)):
            self._guards.pop()
        self._blocks.pop()
        self._indent.pop()

    def visit_SimpleStatementSuite(self, node) -> None:
        self._blocks.append([node, -1])

    def leave_SimpleStatementSuite(self, node) -> None:
        self._blocks.pop()

    def visit_SimpleStatementLine(self, node) -> None:
        self._enter_stmt(node)

    def leave_SimpleStatementLine(self, node) -> None:
        self._leave_stmt(node)

    def visit_For(self, node: cst.For) -> None:
        self._enter_stmt(node)

    def visit_For_body(self, node: cst.For) -> None:
        target = dotted(node.target)
        if target is None and isinstance(node.target, (cst.Tuple, cst.List)):
            target = ",".join(dotted(e.value) or "_" for e in node.target.elements)
        self._loops.append(Loop(target or "_", node.iter, node))

    def leave_For_body(self, node: cst.For) -> None:
        self._loops.pop()

    def leave_For(self, node) -> None:
        self._leave_stmt(node)

    def visit_While(self, node) -> None:
        self._enter_stmt(node)
        self._whiles += 1

    def leave_While(self, node) -> None:
        self._whiles -= 1
        self._leave_stmt(node)

    def visit_Try(self, node) -> None:
        self._enter_stmt(node)

    def leave_Try(self, node) -> None:
        self._leave_stmt(node)

    def visit_Try_body(self, node: cst.Try) -> None:
        caught = set()
        for h in node.handlers:
            caught.update(re.findall(r"\w+", self._text(h.type)) if h.type is not None else ["BaseException"])
        self._guards.append(Guard("import_error" if caught & _IMPORT_ERRORS else "other", node, "",
                                  caught=frozenset(caught)))

    def leave_Try_body(self, node: cst.Try) -> None:
        self._guards.pop()

    def visit_With(self, node: cst.With) -> None:
        self._enter_stmt(node)

    def visit_With_body(self, node: cst.With) -> None:
        for item in node.items:
            self._withs.append(item.item)

    def leave_With_body(self, node: cst.With) -> None:
        for _ in node.items:
            self._withs.pop()

    def leave_With(self, node) -> None:
        self._leave_stmt(node)

    def visit_If(self, node: cst.If) -> None:
        self._enter_stmt(node)
        if isinstance(node.orelse, cst.If):
            self._elifs.add(id(node.orelse))
        self._if_kinds[id(node)] = self._lazy_kind(node.test)
        if id(node) not in self._elifs and _raises(node.body):
            self._maybe_gate(node, node.test)

    def _lazy_kind(self, test: cst.BaseExpression):
        """The guard kind of `test`, computed once, on first use (names read through their bindings)."""
        scopes = (self._scope_stack[-1], self.module_scope)
        cache: list = []

        def kind() -> str:
            if not cache:
                cache.append(self._guard_kind(test, scopes))
            return cache[0]

        return kind

    def visit_If_body(self, node: cst.If) -> None:
        self._guards.append(Guard(None, node, "", "body", len(self._loops) + self._whiles, resolve=self._if_kinds[id(node)]))

    def leave_If_body(self, node: cst.If) -> None:
        self._guards.pop()

    def visit_If_orelse(self, node: cst.If) -> None:
        body_kind = self._if_kinds[id(node)]

        def flipped() -> str:
            kind = body_kind()
            return {"rank0": "not_rank0", "not_rank0": "rank0"}.get(kind, "other" if kind != "version" else "version")

        self._guards.append(Guard(None, node, "", "orelse", len(self._loops) + self._whiles, resolve=flipped))

    def leave_If_orelse(self, node: cst.If) -> None:
        self._guards.pop()

    def leave_If(self, node) -> None:
        self._leave_stmt(node)
        if node.orelse is None and id(node) not in self._elifs and _returns_early(node.body) and len(self._blocks) > 1:
            # `if dist.get_rank() != 0: return`: the rest of the block runs only where the test is false, as in an
            # `else:` (popped with the block, leave_IndentedBlock).
            self.visit_If_orelse(node)
            block = self._blocks[-1][0]
            self._early_exits[id(block)] = self._early_exits.get(id(block), 0) + 1

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._guards.append(Guard(None, node, "", resolve=self._lazy_kind(node.test)))

    def leave_IfExp(self, node) -> None:
        self._guards.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._enter_stmt(node)
        self._class_stack.append(node.name.value)
        if len(self._scope_stack) == 1:
            self.class_bases[node.name.value] = tuple(d for b in node.bases for d in [dotted(b.value)] if d)

    def leave_ClassDef(self, node) -> None:
        self._class_stack.pop()
        self._leave_stmt(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._enter_stmt(node)
        self._units.append(self._unit)
        self._unit = (node, tuple(self._indent), self._blocks[0][1])
        params = [p.name.value for p in node.params.params] + [p.name.value for p in node.params.posonly_params]
        params += [p.name.value for p in node.params.kwonly_params]
        klass = self._class_stack[-1] if self._class_stack else None
        decorators = [dotted(d.decorator if not isinstance(d.decorator, cst.Call) else d.decorator.func) or "" for d in node.decorators]
        scope = Scope(node.name.value, node, params, klass, decorators)
        for p in (*node.params.params, *node.params.posonly_params, *node.params.kwonly_params):
            if p.annotation is not None:
                scope.annotations[p.name.value] = p.annotation.annotation
        self.scopes.append(scope)
        if klass is not None and len(self._scope_stack) == 1:
            self.methods[(klass, node.name.value)] = scope
        elif len(self._scope_stack) == 1:
            self.functions[node.name.value] = scope
        elif not self._class_stack or self._scope_stack[-1].klass == klass:
            self.nested[(id(self._scope_stack[-1]), node.name.value)] = scope
            self.enclosing[id(scope)] = self._scope_stack[-1]
        self._scope_stack.append(scope)
        # A function body runs later, under the guards of its call site, not of its definition.
        self._saved = getattr(self, "_saved", [])
        self._saved.append((self._guards, self._loops, self._withs, self._whiles))
        self._guards, self._loops, self._withs, self._whiles = [], [], [], 0

    def leave_FunctionDef(self, node) -> None:
        self._unit = self._units.pop()
        self._scope_stack.pop()
        self._guards, self._loops, self._withs, self._whiles = self._saved.pop()
        self._leave_stmt(node)

    # -- imports & bindings --------------------------------------------------------
    def visit_Import(self, node: cst.Import) -> None:
        self.resolver.add_import(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.resolver.add_import_from(node)
        self.import_froms.append((node, tuple(self._guards)))
        self._import_scopes[id(node)] = (self._scope_stack[-1], self._seq)

    def _maybe_gate(self, node: cst.CSTNode, test: cst.BaseExpression) -> None:
        """`if <old version>: raise ...` / `assert <new version>` directly in a function body: a gate."""
        scope = self._scope_stack[-1]
        if scope.node is None or self._guards or self._loops:
            return
        if self._guard_kind(test, (scope, self.module_scope)) == "version":
            self.gates.append((scope, self._seq, node))

    def visit_Assert(self, node: cst.Assert) -> None:
        self._maybe_gate(node, node.test)

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        scope = self._scope_stack[-1]
        stmt = self._stmt[-1] if self._stmt else None
        if isinstance(target, cst.Name):
            scope.assigns.setdefault(target.value, []).append((self._seq, value))
            if isinstance(value, (cst.Name, cst.Attribute, cst.IfExp)):
                # (`m = accelerator.unwrap_model(model) if accelerator else model`: the same object either way)
                scope.aliases.append(
                    AttrSet(target.value, None, value, self._next(), stmt, scope, tuple(self._guards), tuple(self._loops)))
            if len(self._scope_stack) == 1 and isinstance(value, (cst.Attribute, cst.Name)):
                self.resolver.add_alias(target.value, value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in self.functions:
                # `rank, local_rank = setup()`: unpack what the helper of this file returns.
                returned = [r for r in self.functions[value.func.value].returns if isinstance(r, cst.Tuple)]
                if len(returned) == 1:
                    value = returned[0]
            for i, el in enumerate(target.elements):
                if isinstance(value, (cst.Tuple, cst.List)) and i < len(value.elements):
                    self._bind(el.value, value.elements[i].value)
        elif isinstance(target, cst.Attribute):
            d = dotted(target)
            if d:
                scope.attr_sets.append(
                    AttrSet(d, None, value, self._next(), stmt, scope, tuple(self._guards), tuple(self._loops))
                )
                scope.assigns.setdefault(d, []).append((self._seq, value))
        elif isinstance(target, cst.Subscript):
            d = dotted(target.value)
            sl = target.slice[0].slice if target.slice else None
            key = None
            if isinstance(sl, cst.Index) and isinstance(sl.value, cst.SimpleString):
                key = sl.value.evaluated_value if isinstance(sl.value.evaluated_value, str) else None
            if d:
                scope.dict_sets.append(
                    AttrSet(d, key, value, self._next(), stmt, scope, tuple(self._guards), tuple(self._loops))
                )

    def leave_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            self._bind(t.target, node.value)
        call = self._by_node.get(id(node.value))
        if call is not None:
            call.targets = [t.target for t in node.targets]

    def leave_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind(node.target, node.value)
            call = self._by_node.get(id(node.value))
            if call is not None:
                call.targets = [node.target]

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None:
            self._scope_stack[-1].returns.append(node.value)

    # -- calls ---------------------------------------------------------------------
    def leave_Call(self, node: cst.Call) -> None:
        func = node.func
        method = func.attr.value if isinstance(func, cst.Attribute) else None
        receiver = func.value if isinstance(func, cst.Attribute) else None
        named = _getattr_method(func)
        if named is not None:
            # `getattr(model, "no_sync")()` is `model.no_sync()`. (With a default, `getattr(model, "no_sync",
            # nullcontext)()`, it may be the default instead: not read as the method.)
            receiver, method = named
        scope = self._scope_stack[-1]
        call = Call(
            node=node,
            seq=self._next(),
            qualname=None,  # resolved after the visit, once every import is known
            api=None,
            func=dotted(func),
            method=method,
            receiver=receiver,
            stmt=self._stmt[-1] if self._stmt else None,
            scope=scope,
            guards=tuple(self._guards),
            loops=tuple(self._loops),
            withs=tuple(self._withs),
            whiles=self._whiles,
        )
        self.calls.append(call)
        scope.calls.append(call)
        self._by_node[id(node)] = call


_ALL_QUALIFIED = frozenset(q for names in QUALIFIED.values() for q in names)
# Methods that run before any other method of their class can (constructors, dataclass hooks).
_CONSTRUCTORS = ("__init__", "__post_init__", "__new__")
# Library helpers that raise when a requirement is not met (transformers/accelerate/packaging style).
_REQUIRE_CALLS = re.compile(r"(^|\.)(require_version\w*|check_min_version|require_torch\w*)$")


def _returns_early(body: cst.BaseSuite) -> bool:
    """An `if` body that only returns (perhaps after logging): the code after the `if` runs when it is false."""
    stmts = body.body if isinstance(body, cst.IndentedBlock) else [body]
    if not stmts or not all(isinstance(st, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) for st in stmts):
        return False
    last = stmts[-1].body
    if not last or not isinstance(last[-1], cst.Return):
        return False
    return all(isinstance(x, (cst.Expr, cst.Pass)) for st in stmts for x in st.body if x is not last[-1])


def _raises(body: cst.BaseSuite) -> bool:
    stmts = body.body if isinstance(body, cst.IndentedBlock) else [body]
    for st in stmts:
        small = st.body if isinstance(st, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else ()
        if any(isinstance(x, cst.Raise) for x in small):
            return True
    return False


def _apply_gates(c: "Collector") -> None:
    """A version gate that refuses old releases guards the code after it: in a function, the calls
    and imports that follow it; in a constructor, every method of the class (none can run on an
    object that was never built); in a same-file helper, the functions that call the helper first.
    The guarded code gets a "version" guard, as if it sat inside the version check."""
    for call in c.calls:
        if call.func and _REQUIRE_CALLS.search(call.func) and call.scope.node is not None and not call.guards:
            c.gates.append((call.scope, call.seq, call.node))
    if not c.gates:
        return
    gated: dict[int, tuple[int, Guard]] = {}  # scope id -> (seq from which it is gated, guard)
    helpers = {id(scope) for scope, _, _ in c.gates if scope.klass is None}
    for scope, seq, node in c.gates:
        g = Guard("version", node)
        if scope.klass is not None and scope.name in _CONSTRUCTORS:
            for (klass, _), m in c.methods.items():
                if klass == scope.klass and m is not scope:
                    gated[id(m)] = (0, g)
        if id(scope) not in gated or gated[id(scope)][0] > seq:
            gated[id(scope)] = (seq, g)
    if helpers:
        by_name = {name: s for name, s in c.functions.items() if id(s) in helpers}
        for call in c.calls:
            callee = by_name.get(call.func or "")
            if callee is not None and call.scope.node is not None and not call.guards and id(call.scope) not in gated:
                gated[id(call.scope)] = (call.seq, gated[id(callee)][1])
    for call in c.calls:
        hit = gated.get(id(call.scope))
        if hit is not None and call.seq > hit[0]:
            call.guards = call.guards + (hit[1],)
    for i, (node, guards) in enumerate(c.import_froms):
        scope, seq = c._import_scopes.get(id(node), (None, 0))
        hit = gated.get(id(scope)) if scope is not None else None
        if hit is not None and seq >= hit[0]:
            c.import_froms[i] = (node, guards + (hit[1],))


# Fields that hold only whitespace, comments or punctuation: never a call, binding or statement.
_SKIP_FIELDS = frozenset({
    "leading_lines", "lines_after_decorators", "lpar", "rpar", "comma", "semicolon", "equal", "colon", "dot",
    "header", "footer", "trailing_whitespace", "lbracket", "rbracket", "lbrace", "rbrace", "star", "asynchronous",
    "operator", "newline", "default_indent", "default_newline", "encoding", "has_trailing_newline", "indent",
    "whitespace", "value_str",
})
_PLAN: dict[type, tuple] = {}


# Field annotations that never hold a node (a leaf's text, flags).
_LEAF_TYPES = (str, bool, int, float, typing.Optional[str])
_IS_NODE: dict[type, bool] = {}


def _plan(visitor: "Collector", cls: type) -> tuple:
    """Per node class: its visit/leave hooks and, per child field, the field hooks."""
    name = cls.__name__
    vt = type(visitor)
    fields = []
    for f in dataclasses.fields(cls):
        if f.name in _SKIP_FIELDS or f.name.startswith("whitespace"):
            continue
        if f.type in _LEAF_TYPES or typing.get_origin(f.type) is typing.Literal:
            continue
        fields.append((f.name, getattr(vt, f"visit_{name}_{f.name}", None), getattr(vt, f"leave_{name}_{f.name}", None)))
    return (getattr(vt, f"visit_{name}", None), getattr(vt, f"leave_{name}", None), tuple(fields))


def _walk(visitor: "Collector", node: cst.CSTNode) -> None:
    """A read-only traversal: libcst's own `visit` rebuilds every node (it serves transformers),
    which costs about twice the parse; this reaches the same hooks in source order."""
    cls = type(node)
    plan = _PLAN.get(cls)
    if plan is None:
        plan = _PLAN[cls] = _plan(visitor, cls)
    visit, leave, fields = plan
    if visit is not None:
        visit(visitor, node)
    # The unit that holds the node (after `visit`, which moves to a new one): positions
    # render only the units that hold a finding.
    visitor.top[id(node)] = visitor._unit
    is_node = _IS_NODE
    for fname, fvisit, fleave in fields:
        value = getattr(node, fname)
        if fvisit is not None:
            fvisit(visitor, node)
        vt = type(value)
        if vt is list or vt is tuple:
            for item in value:
                it = type(item)
                ok = is_node.get(it)
                if ok is None:
                    ok = is_node[it] = issubclass(it, cst.CSTNode)
                if ok:
                    _walk(visitor, item)
        else:
            ok = is_node.get(vt)
            if ok is None:
                ok = is_node[vt] = issubclass(vt, cst.CSTNode)
            if ok:
                _walk(visitor, value)
        if fleave is not None:
            fleave(visitor, node)
    if leave is not None:
        leave(visitor, node)


def _getattr_method(func: cst.BaseExpression) -> Optional[tuple[cst.BaseExpression, str]]:
    """(object, method name) of a callee written `getattr(obj, "name")`, with the name a literal."""
    if not (isinstance(func, cst.Call) and isinstance(func.func, cst.Name) and func.func.value == "getattr"):
        return None
    args = func.args
    if len(args) != 2 or any(a.keyword is not None or a.star for a in args):
        return None
    name = args[1].value.evaluated_value if isinstance(args[1].value, cst.SimpleString) else None
    return (args[0].value, name) if isinstance(name, str) and name.isidentifier() else None


def collect(module: cst.Module) -> Collector:
    c = Collector(module)
    _walk(c, module)
    _apply_gates(c)
    r = c.resolver
    for call in c.calls:
        func = call.node.func
        qual = r.qualify(func)
        if qual is None and isinstance(func, cst.Name) and r.star_modules:
            qual = r.qualify_star(func.value, _ALL_QUALIFIED)
        call.qualname = qual
        call.api = api_of(qual)
        if call.api is None and call.func == "dict" and qual in (None, "dict", "builtins.dict"):
            lazy = _lazy_type(call.node, r)
            if lazy is not None:
                call.qualname, call.api = lazy
    return c


def _lazy_type(node: cst.Call, r) -> Optional[tuple[str, str]]:
    """A lazy call of an mmengine-style config (`dict(type=BitsAndBytesConfig, load_in_4bit=True)`, which the
    registry builds as `BitsAndBytesConfig(load_in_4bit=True)`): (qualified name, api) of its `type`."""
    if any(a.keyword is None for a in node.args):
        return None
    t = next((a.value for a in node.args if a.keyword is not None and a.keyword.value == "type"), None)
    if not isinstance(t, (cst.Name, cst.Attribute)):
        return None
    qual = r.qualify(t)
    api = api_of(qual)
    return (qual, api) if api is not None else None
