"""The project a linted file belongs to: its root, its own modules, and how imports between them resolve.

Per file, once: a small serialisable fact sheet (imports, top-level functions and classes, whether each
may touch a model), from CPython's parser and cached by content hash (see `cache.py`). Per project,
cheaply: imports resolve to files of the project (absolute, relative, `src/` layout, re-exports in
`__init__.py`), and a called project function is parsed with libcst (once per process) only when its
fact sheet says it may do something the analysis records; `builder.py` then inlines it like a helper of
the same file. In a run over the project with one job, a module that is linted too is parsed whole once,
when another file's calls first reach it, and its own lint reuses that parse (`expect`; the run lints a
file before the modules it imports, see `engine.lint_files`). Library packages never resolve into the
project, even when the project vendors them.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Optional

import libcst as cst

from fsdplint.analysis import reads
from fsdplint.apis import QUALIFIED, SUMMARY_CALLS, SUMMARY_WORDS, TRIGGER_WORDS, api_of
from fsdplint.findings import Related
from fsdplint.module_exports import dotted_name as _dotted
from fsdplint.module_exports import dunder_all  # noqa: F401  (re-exported)
from fsdplint.parsing import parse_module
from fsdplint.roots import ROOT_MARKERS, find_root, linted_root  # noqa: F401  (re-exported)

# Top-level packages that are libraries whatever the project holds (their behaviour is data in apis.py).
LIBRARIES = frozenset({
    "torch", "transformers", "peft", "accelerate", "trl", "bitsandbytes", "deepspeed", "datasets", "numpy",
    "safetensors", "huggingface_hub", "torchtune", "torchao", "lightning", "pytorch_lightning",
})
SHEET_VERSION = 8
STAR = "*"  # an import entry `[STAR, module, STAR, level]`: `from module import *`
_MAX_FILE_BYTES = 2_000_000
_MAX_MODULES = 128  # whole parsed modules kept per process (libcst trees are large)
# Partial parses kept apart: every linted file's own parse joins the whole modules, and sharing one bound
# let a run over a large repository evict (and parse again) the helpers many of its files call.
_MAX_PARTS = 256
# Whole parses of files this process lints later (see `expect`), made when another file's calls reach them
# first: the file's own lint takes the parse over instead of parsing it again.
_MAX_AHEAD = 256
_BUILTINS = frozenset(dir(builtins))  # never looked up through a star import
_CALLS = SUMMARY_CALLS | {q.rsplit(".", 1)[-1] for names in QUALIFIED.values() for q in names}
_WORDS = re.compile("|".join(re.escape(w) for w in sorted(set(TRIGGER_WORDS) | set(SUMMARY_WORDS), key=len, reverse=True)))


_INDENTED_IMPORT = re.compile(r"^[ \t]+(?:from[ \t]+[\w.]+[ \t]+import|import)[ \t]", re.M)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# -- fact sheets ---------------------------------------------------------------------------
def _nodes(root, only: type | tuple = ast.AST) -> list:
    """`root` and every node under it, in `ast.walk`'s order (breadth first), without its generator per
    node (the fact sheets walk every function of every module the run reaches). `only`: the nodes kept and
    looked into; a subtree whose root is not one holds none of them (statements: only statements and
    handlers hold statements), and leaving it out keeps the order of the others."""
    out = [root]
    i = 0
    while i < len(out):
        node = out[i]
        i += 1
        for name in node._fields:
            v = getattr(node, name, None)
            if isinstance(v, list):
                out.extend(x for x in v if isinstance(x, only))
            elif isinstance(v, only):
                out.append(v)
    return out


def _function_sheet(fn, lines: list[str], loads: Optional[dict] = None) -> dict:
    """`loads`: filled with the names the function reads (`fn` -> set), for its `refs` (see `fact_sheet`)."""
    body = "\n".join(lines[fn.lineno - 1: fn.end_lineno])
    called: set = set()
    read: set = set()
    for n in _nodes(fn):
        if isinstance(n, ast.Call):
            d = _dotted(n.func)
            if d:
                called.add(d)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            read.add(n.id)
    if loads is not None:
        loads[id(fn)] = read
    calls = sorted(called)
    touches = bool(_WORDS.search(body)) or any(c.rsplit(".", 1)[-1] in _CALLS for c in calls)
    start = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    return {"line": fn.lineno, "span": [start, fn.end_lineno], "touches": touches, "calls": calls,
            "property": any(_dotted(d) == "property" for d in fn.decorator_list), "made": _made(fn)}


_HOLDS_STATEMENTS = (ast.stmt, ast.excepthandler, ast.match_case)


def _made(fn) -> Optional[list]:
    """What the function returns, when every `return` calls a name (`return GPT(cfg)`): those names, so a
    caller can tell the class of `model = build(cfg)`; None when some return is anything else."""
    out: list = []
    todo = list(fn.body)
    skip = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
    while todo:
        node = todo.pop()
        if isinstance(node, skip):
            continue
        if isinstance(node, ast.Return):
            name = _dotted(node.value.func) if isinstance(node.value, ast.Call) else None
            if name is None:
                return None
            if name not in out:
                out.append(name)
            continue
        for field in node._fields:  # ast.iter_child_nodes(node), inline
            v = getattr(node, field, None)
            if isinstance(v, list):
                todo.extend(x for x in v if isinstance(x, ast.AST))
            elif isinstance(v, ast.AST):
                todo.append(v)
    return out or None


def fact_sheet(text: str) -> dict:
    """Imports, top-level functions and classes of a module (JSON-serialisable). Unparsable: empty."""
    sheet: dict = {"v": SHEET_VERSION, "imports": [], "functions": {}, "classes": {}}
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return sheet
    lines = text.splitlines()

    seen: set[int] = set()

    def imports(stmts):
        for node in stmts:
            seen.add(id(node))
            if isinstance(node, ast.Import):
                for a in node.names:
                    local = a.asname or a.name.split(".", 1)[0]
                    sheet["imports"].append([local, a.name if a.asname else local, None, 0])
            elif isinstance(node, ast.ImportFrom):
                for a in node.names:
                    local = STAR if a.name == "*" else a.asname or a.name
                    sheet["imports"].append([local, node.module or "", a.name, node.level])
            elif isinstance(node, (ast.If, ast.Try)):  # `try: from x import y` / `if TYPE_CHECKING:`
                imports(node.body)
                for h in getattr(node, "handlers", ()):
                    imports(h.body)
                imports(node.orelse)

    imports(tree.body)
    # Imports inside functions (`def setup(): from .lora import inject`), ahead of the module's own: a
    # name the module binds at top level keeps that meaning, one only a function imports still resolves.
    if _INDENTED_IMPORT.search(text):
        top, sheet["imports"] = sheet["imports"], []
        imports([n for n in _nodes(tree, _HOLDS_STATEMENTS) if isinstance(n, (ast.Import, ast.ImportFrom))
                 and id(n) not in seen])
        sheet["imports"] += top
    public = dunder_all(tree.body)
    if public is not None:
        sheet["all"] = public
    defs = {}
    loads: dict = {}  # id of a function node -> the names it reads
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            sheet["functions"][node.name] = _function_sheet(node, lines, loads)
            defs[node.name] = [(node, sheet["functions"][node.name])]
        elif isinstance(node, ast.ClassDef):
            methods = {n.name: _function_sheet(n, lines, loads) for n in node.body
                       if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            sheet["classes"][node.name] = {"line": node.lineno, "span": [start, node.end_lineno],
                                           "bases": [d for b in node.bases for d in [_dotted(b)] if d],
                                           "methods": methods}
            defs[node.name] = [(n, methods[n.name]) for n in node.body
                               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    # Top-level definitions a function names without calling them (`MethodType(_enable, model)`,
    # `partial(step, cfg)`, `model.apply(init_fn)`): what runs them is library code, so `calls` misses them,
    # and a partial parse of the module must keep them.
    for items in defs.values():
        for fn, d in items:
            called = set(d["calls"])
            refs = sorted(n for n in loads[id(fn)] if n in defs and n not in called and n != fn.name)
            if refs:
                d["refs"] = refs
    return sheet


@dataclass
class ForeignModule:
    """A parsed module of the project that the linted file reaches."""

    path: Path
    text: str
    module: cst.Module
    collector: object  # fsdplint.collect.Collector

    @cached_property
    def positions(self):
        from fsdplint.positions import Positions

        return Positions(self.module, self.text, self.collector.top)

    @cached_property
    def display(self) -> str:
        """The path as findings print it: relative to the working directory where possible."""
        try:
            return str(self.path.relative_to(Path.cwd().resolve()))
        except ValueError:  # outside the working directory
            return str(self.path)

    @cached_property
    def scope_of_def(self) -> dict:
        return {id(s.node): s for s in self.collector.scopes if s.node is not None}


class Project:
    """Import resolution and fact sheets for one project root (one instance per root and process)."""

    def __init__(self, root: Path, cache=None) -> None:
        self.root = root
        self.cache = cache
        # Top-level packages never followed as the project's code. A library's own repository keeps its
        # package a library too: following it into the library's internals raises findings on code no
        # launch of the repository runs as a job (see `ScriptAnalysis.unseen` for what that leaves unread).
        self.libraries = LIBRARIES
        self._texts: dict[Path, tuple] = {}  # path -> ((mtime, size), text, generation it was checked in)
        # Files are checked for changes once per linted file (a long-lived process may see them change).
        self.generation = 0
        self._sheets: dict[str, dict] = {}  # content hash -> fact sheet
        self._by_path: dict[Path, tuple] = {}  # path -> ((mtime, size), fact sheet)
        self._files: dict[tuple, Optional[Path]] = {}
        self._bases: dict[Path, list[Path]] = {}
        self._modules: "OrderedDict[Path, Optional[ForeignModule]]" = OrderedDict()
        self._parts: "OrderedDict[tuple, Optional[ForeignModule]]" = OrderedDict()  # (path, kept) -> part
        self._touch: dict[tuple, bool] = {}
        self._classes: dict[tuple, Optional[tuple]] = {}  # (importer, version, name, own) -> (file, class)
        self._resolved: dict[tuple, tuple] = {}  # (importer, name) -> (the import list asked with, result)
        self._stars: dict[tuple, Optional[tuple]] = {}  # (module, name, stamp) -> what its star import binds
        self._partial_of: dict[tuple, str] = {}  # (path, kept definitions) -> the text it was cut from
        self._first_part: dict[Path, frozenset] = {}  # path -> the definitions its first partial parse kept
        self._ahead: "OrderedDict[Path, ForeignModule]" = OrderedDict()  # parses of files still to be linted

    # -- files -------------------------------------------------------------------------
    def text(self, path: Path) -> Optional[str]:
        """The file's text, re-read when its size or modification time changed (a long-lived process)."""
        reads.note(path)  # a dependency of the linted file's findings (see findings_cache.py)
        hit = self._texts.get(path)
        if hit is not None and hit[2] == self.generation:
            return hit[1]
        try:
            st = path.stat()
        except OSError:
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if hit is not None and hit[0] == stamp:
            self._texts[path] = (stamp, hit[1], self.generation)
            return hit[1]
        text = None
        if st.st_size <= _MAX_FILE_BYTES:
            try:
                text = path.read_bytes().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                text = None
        self._texts[path] = (stamp, text, self.generation)
        return text

    def sheet(self, path: Path, text: Optional[str] = None) -> dict:
        given = text is not None
        text = self.text(path) if text is None else text
        if text is None:
            return fact_sheet("")
        stamp = self._stamp(path)
        hit = self._by_path.get(path) if not given else None
        if hit is not None and hit[0] == stamp:
            return hit[1]
        key = content_hash(text)
        sheet = self._sheets.get(key)
        if sheet is not None:
            self._by_path[path] = (stamp, sheet)
            return sheet
        sheet = self.cache.get(key) if self.cache is not None else None
        if sheet is None or sheet.get("v") != SHEET_VERSION:
            sheet = fact_sheet(text)
            if self.cache is not None:
                self.cache.put(key, sheet)
        self._sheets[key] = sheet
        if not given:
            self._by_path[path] = (stamp, sheet)
        return sheet

    def _module_file(self, base: Path, parts: list[str]) -> Optional[Path]:
        key = (base, tuple(parts))
        if key not in self._files:
            found = None
            stem = base.joinpath(*parts) if parts else base
            for cand in (stem.with_name(stem.name + ".py") if parts else None, stem / "__init__.py"):
                if cand is not None and cand.is_file():
                    found = cand
                    break
            self._files[key] = found
        return self._files[key]

    def _import_bases(self, importer: Path) -> list[Path]:
        """Where an absolute import from `importer` may resolve, most likely first: the script's own directory
        (first on sys.path), the directory above the package the importer sits in, the project root and its
        src/ layout, then the directories between the importer and the root (a tree copied inside an
        unrelated repository is rooted at that repository, and its own top-level packages sit lower)."""
        hit = self._bases.get(importer.parent)
        if hit is None:
            top = importer.parent
            while (top / "__init__.py").is_file() and top.parent != top:
                top = top.parent
            between = [d for d in importer.parent.parents if d == self.root or self.root in d.parents]
            hit = self._bases[importer.parent] = list(dict.fromkeys(
                [importer.parent, top, self.root, self.root / "src", *between]))
        return hit

    def find_module(self, importer: Path, module: str, level: int) -> Optional[Path]:
        """The project file of `module` as imported from `importer` (`level`: leading dots), if any."""
        parts = [p for p in module.split(".") if p]
        if level:
            base = importer.parent
            for _ in range(level - 1):
                base = base.parent
            return self._module_file(base, parts)
        if not parts or parts[0] in self.libraries:
            return None
        # A script's own directory comes first on sys.path; then the root and a src/ layout.
        for base in self._import_bases(importer):
            found = self._module_file(base, parts)
            if found is not None:
                return found
        return None

    def _namespace_dir(self, importer: Path, module: str, level: int) -> Optional[Path]:
        """The directory of a package without `__init__.py` (a script directory, a namespace package)."""
        parts = [p for p in module.split(".") if p]
        if level:
            base = importer.parent
            for _ in range(level - 1):
                base = base.parent
            bases = [base]
        elif parts and parts[0] not in self.libraries:
            bases = self._import_bases(importer)
        else:
            return None
        for b in bases:
            d = b.joinpath(*parts)
            if d.is_dir():
                return d
        return None

    # -- names -------------------------------------------------------------------------
    def resolve(self, importer: Path, imports: list, name: str, depth: int = 0) -> Optional[tuple[Path, str]]:
        """(file, "function" or "Class.method") that the dotted `name` used in `importer` denotes, following
        imports and re-exports; None for anything that is not a project function."""
        if depth > 4:
            return None
        if not depth:
            # Another module's calls are resolved again by every linted file that runs them: memoised for
            # the fact sheet's own import list (kept in the entry, so a new sheet never matches an old one).
            hit = self._resolved.get((importer, name))
            if hit is not None and hit[0] is imports:
                return hit[1]
            found = self._resolve(importer, imports, name, depth)
            self._resolved[(importer, name)] = (imports, found)
            return found
        return self._resolve(importer, imports, name, depth)

    def _resolve(self, importer: Path, imports: list, name: str, depth: int) -> Optional[tuple[Path, str]]:
        head, _, rest = name.partition(".")
        for local, module, attr, level in reversed(imports):
            if local != head:
                continue
            if attr is None:  # `import a.b` / `import a.b as m`
                full = f"{module}.{rest}" if rest else module
                return self._resolve_dotted(importer, full, depth)
            if not level and api_of(f"{module}.{attr}") is not None:
                return None
            target = self.find_module(importer, module, level)
            pkg = target.parent if target is not None and target.name == "__init__.py" else (
                self._namespace_dir(importer, module, level) if target is None else None)
            sub = self._module_file(pkg, [attr]) if pkg is not None else None
            if sub is not None:  # `from pkg import submodule`
                return self._in_file(sub, rest, depth + 1) if rest else None
            if target is None:
                return None
            return self._in_file(target, f"{attr}.{rest}" if rest else attr, depth + 1)
        if head in _BUILTINS:
            return None
        for local, module, attr, level in reversed(imports):  # `from module import *`: its public names
            if local == STAR:
                target = self.find_module(importer, module, level)
                if target is not None and target != importer and self.exports(target, head):
                    found = self._through_star(target, name, depth)
                    if found is not None:
                        return found
        return None

    def _through_star(self, target: Path, name: str, depth: int) -> Optional[tuple[Path, str]]:
        # Memoised per module and name: a package `__init__` star-importing its submodules is asked about
        # every unknown name of every importer.
        key = (target, name, self._stamp(target))
        if key not in self._stars:
            self._stars[key] = None  # recursion guard
            self._stars[key] = self._in_file(target, name, depth + 1)
        return self._stars[key]

    def exports(self, path: Path, name: str) -> bool:
        """Whether `from <module at path> import *` binds `name`: listed in its `__all__`, or, without one,
        public (no leading underscore). Read off the module's fact sheet: nothing is parsed per importer."""
        public = self.sheet(path).get("all")
        return name in public if public is not None else not name.startswith("_")

    def star_library_names(self, importer: Path, imports: list) -> dict[str, str]:
        """Library names a file's star imports of project modules bind (`from common import *` where
        common.py imports torch and FSDP): local name -> qualified name, for the resolver."""
        out: dict[str, str] = {}
        for local, module, attr, level in imports:
            if local == STAR:
                target = self.find_module(importer, module, level)
                if target is not None and target != importer:
                    for name, qual in self._library_exports(target, 0).items():
                        out.setdefault(name, qual)
        return out

    def _library_exports(self, path: Path, depth: int) -> dict[str, str]:
        sheet = self.sheet(path)  # (re-)reads the file first: the key's stamp is its current one
        key = ("lib", path, self._stamp(path))
        if key in self._stars:
            return self._stars[key] or {}
        self._stars[key] = None  # recursion guard
        out: dict[str, str] = {}
        for local, module, attr, level in sheet["imports"]:
            if local == STAR:
                target = self.find_module(path, module, level) if depth < 3 else None
                if target is not None and target != path:
                    for name, qual in self._library_exports(target, depth + 1).items():
                        if self.exports(path, name):
                            out.setdefault(name, qual)
            elif not level and self.exports(path, local) and self.find_module(path, module, 0) is None:
                out.setdefault(local, f"{module}.{attr}" if attr is not None else module)
        self._stars[key] = out
        return out

    def _resolve_dotted(self, importer: Path, full: str, depth: int) -> Optional[tuple[Path, str]]:
        parts = full.split(".")
        for i in range(len(parts) - 1, 0, -1):
            f = self.find_module(importer, ".".join(parts[:i]), 0)
            if f is not None:
                return self._in_file(f, ".".join(parts[i:]), depth + 1)
        return None

    def _in_file(self, path: Path, name: str, depth: int) -> Optional[tuple[Path, str]]:
        sheet = self.sheet(path)
        head, _, rest = name.partition(".")
        if head in sheet["functions"] and not rest:
            return path, head
        cls = sheet["classes"].get(head)
        if cls is not None:
            return (path, f"{head}.{rest}") if rest in cls["methods"] else None
        return self.resolve(path, sheet["imports"], name, depth + 1)  # a re-export

    def resolve_class(self, importer: Path, imports: list, name: str, own: bool = True) -> Optional[tuple[Path, str]]:
        """(file, class name) that the dotted `name` used in `importer` denotes when it is a class of the
        project: defined in `importer` itself (`own`: look there too), imported, or re-exported; else None.
        Memoised per importer version (a name is asked at every call that uses it, from every linted file)."""
        key = (importer, self._stamp(importer), name, own)
        hit = self._classes.get(key, self)
        if hit is self:
            hit = self._classes[key] = self._resolve_class(importer, imports, name, own)
        return hit

    def _resolve_class(self, importer: Path, imports: list, name: str, own: bool) -> Optional[tuple[Path, str]]:
        if own:
            sheet = self.sheet(importer)
            if name in sheet["classes"]:
                return importer, name
            if name in sheet["functions"]:
                return None
        # `Class.__init__` resolves where `Class` does (a class without `__init__`: its fact sheet says so).
        found = self.resolve(importer, imports, f"{name}.__init__")
        if found is not None:
            return found[0], found[1].rpartition(".")[0]
        return self._class_in(importer, imports, name, 0)

    def _class_in(self, importer: Path, imports: list, name: str, depth: int) -> Optional[tuple[Path, str]]:
        if depth > 4:
            return None
        head, _, rest = name.partition(".")
        for local, module, attr, level in reversed(imports):
            if local != head:
                continue
            if attr is None:
                mod = self.find_module(importer, f"{module}.{rest}".rpartition(".")[0] if rest else module, 0)
                cls = name.rpartition(".")[2]
                return (mod, cls) if rest and mod is not None and cls in self.sheet(mod)["classes"] else None
            if rest or (not level and api_of(f"{module}.{attr}") is not None):
                return None
            target = self.find_module(importer, module, level)
            if target is None:
                return None
            sheet = self.sheet(target)
            if attr in sheet["classes"]:
                return target, attr
            return self._class_in(target, sheet["imports"], attr, depth + 1)  # a re-export
        return None

    def resolve_module(self, importer: Path, imports: list, name: str) -> Optional[Path]:
        """The project file of the module that the plain name `name` denotes in `importer` (`import trainers`,
        `from pkg import trainers`); None for anything else."""
        for local, module, attr, level in reversed(imports):
            if local != name:
                continue
            if attr is None:
                return self.find_module(importer, module, 0)
            target = self.find_module(importer, module, level)
            pkg = target.parent if target is not None and target.name == "__init__.py" else (
                self._namespace_dir(importer, module, level) if target is None else None)
            return self._module_file(pkg, [attr]) if pkg is not None else None
        return None

    def function(self, path: Path, qual: str) -> Optional[dict]:
        sheet = self.sheet(path)
        if "." in qual:
            cls, _, meth = qual.partition(".")
            return sheet["classes"].get(cls, {}).get("methods", {}).get(meth)
        return sheet["functions"].get(qual)

    def callees(self, path: Path, qual: str, depth: int = 3) -> set[str]:
        """The dotted names the function calls, and those its project callees call (`depth` levels): what
        unread code may do, for a rule that must rule an effect out."""
        out: set[str] = set()
        todo = [(path, qual, 0)]
        seen: set[tuple] = set()
        while todo:
            p, q, d = todo.pop()
            if (p, q) in seen:
                continue
            seen.add((p, q))
            fn = self.function(p, q)
            if fn is None:
                continue
            out.update(fn["calls"])
            if d >= depth:
                continue
            sheet = self.sheet(p)
            for callee in fn["calls"]:
                target = (p, callee) if callee in sheet["functions"] else self.resolve(p, sheet["imports"], callee)
                if target is not None:
                    todo.append((*target, d + 1))
        return out

    def touches(self, path: Path, qual: str, depth: int = 0) -> bool:
        """Whether the function may do something the analysis records: its text names a model operation,
        or it calls a project function that does (bounded, recursion-safe)."""
        key = (path, qual, self._stamp(path))
        if key in self._touch:
            return self._touch[key]
        self._touch[key] = False  # recursion guard
        fn = self.function(path, qual)
        out = False
        if fn is not None:
            out = fn["touches"]
            if not out and depth < 4:
                sheet = self.sheet(path)
                cls = qual.partition(".")[0] if "." in qual else None
                for callee in fn["calls"]:
                    if cls and callee.startswith("self."):
                        target = (path, f"{cls}.{callee[5:]}") if callee[5:] in sheet["classes"][cls]["methods"] else None
                    elif callee in sheet["functions"]:
                        target = (path, callee)
                    else:
                        target = self.resolve(path, sheet["imports"], callee)
                    if target is None and self._touching_method(path, sheet, callee, depth):
                        out = True
                        break
                    if target is not None and self.touches(*target, depth=depth + 1):
                        out = True
                        break
        self._touch[key] = out
        return out

    def _touching_method(self, path: Path, sheet: dict, callee: str, depth: int) -> bool:
        """`loader.load(...)` on a local object of a class the sheet cannot name (picked from a registry, made
        by a factory): whether some class of the same file has a method of that name that touches a model."""
        head, dot, meth = callee.partition(".")
        if not dot or "." in meth or head in ("self", "cls") or head in sheet["classes"] or head in sheet["functions"]:
            return False
        if any(imp[0] == head for imp in sheet["imports"]):
            return False
        return any(meth in c["methods"] and self.touches(path, f"{name}.{meth}", depth + 1)
                   for name, c in sheet["classes"].items())

    def _stamp(self, path: Path):
        hit = self._texts.get(path)
        return hit[0] if hit is not None else None

    def imports_touching(self, importer: Path, imports: list) -> bool:
        """Whether a file that names no model operation itself imports a project function that does."""
        for local, module, attr, level in imports:
            if local == STAR:  # `from utils import *`: any function it exports
                target = self.find_module(importer, module, level)
                if target is not None and target != importer and any(
                        self.exports(target, f) and self.touches(target, f) for f in self.sheet(target)["functions"]):
                    return True
                continue
            if attr is None:  # `import utils`: any function of it
                target = self.find_module(importer, module, 0)
                if target is not None and any(self.touches(target, f) for f in self.sheet(target)["functions"]):
                    return True
                continue
            found = self.resolve(importer, imports, local)
            if found is not None and self.touches(*found):
                return True
        return False

    # -- parsed modules ----------------------------------------------------------------
    def remember(self, path: Path, text: str, module: cst.Module, collector) -> None:
        """Keep the linted file's own parse: another linted file that imports it reuses it."""
        self._store(path, ForeignModule(path, text, module, collector))

    def parsed(self, path: Optional[Path], text: str) -> Optional[ForeignModule]:
        """The parse of this exact text of the file, if another file's analysis already made it."""
        if path is None:
            return None
        return self._whole(path.resolve(), text)

    def _whole(self, path: Path, text: str) -> Optional[ForeignModule]:
        """A whole parse of this text of the file, if at hand: a linted file's own, or one that another
        file's calls made (most recently used first)."""
        for table, key in ((self._modules, path), (self._ahead, path), (self._parts, (path, None))):
            fm = table.get(key)
            if fm is not None and fm.text == text:
                table.move_to_end(key)
                return fm
        return None

    def _store(self, path, fm: Optional[ForeignModule]) -> None:
        table, bound = (self._parts, _MAX_PARTS) if isinstance(path, tuple) else (self._modules, _MAX_MODULES)
        table[path] = fm
        table.move_to_end(path)
        while len(table) > bound:
            table.popitem(last=False)

    def module(self, path: Path, need: Optional[str] = None) -> Optional[ForeignModule]:
        """The module parsed: whole when a linted file's parse is at hand, else only what `need` (a function
        or "Class.method") reaches in it — its top-level definitions, the others blanked out, so lines and
        columns stay those of the file and the parse costs what the needed code costs."""
        text = self.text(path)
        if text is None:
            return None
        full = self._whole(path, text)
        if full is not None:
            return full
        if path in _UPCOMING and _claimed(path):  # its own lint comes later in this process: parse it whole, once
            fm = self._parse_ahead(path, text)
            if fm is not None:
                return fm
        keep = self._needed(path, need) if need is not None else None
        if path in _ELSEWHERE:
            # Another process lints it: the files of the run that reach one part of it mostly reach others
            # too, and a second part would mean a second parse here (a part, then the whole).
            keep = None
        if keep is not None and self._first_part.get(path) not in (None, keep):
            keep = None  # a second part of the same module wanted: parse it whole, once, for every later call
        key = (path, keep)
        fm = self._parts.get(key)
        if fm is not None and fm.text is not None and self._partial_of.get(key) == text:
            self._parts.move_to_end(key)
            return fm
        from fsdplint.collect import collect

        source = self._blank_except(path, text, keep) if keep is not None else text
        try:
            module = parse_module(source, path, part=keep is not None)
            fm = ForeignModule(path, source, module, collect(module))
        except Exception:  # a module that does not parse stays unknown
            fm = None
        self._partial_of[key] = text
        if keep is not None:
            self._first_part.setdefault(path, keep)
        self._store(key, fm)  # apart from the linted files' own parses, which would soon evict it
        return fm

    def _parse_ahead(self, path: Path, text: str) -> Optional[ForeignModule]:
        from fsdplint.collect import collect

        try:
            module = parse_module(text, path)
        except Exception:  # not parsed ahead again: the partial parse below decides what is known of it
            _UPCOMING.discard(path)
            return None
        fm = self._ahead[path] = ForeignModule(path, text, module, collect(module))
        while len(self._ahead) > _MAX_AHEAD:
            self._ahead.popitem(last=False)
        return fm

    def linted(self, path: Path) -> None:
        """The file's lint is over: a parse made ahead of it joins the parts other files reached (it was
        reached once: later callers likely reach it again), instead of only the linted files' own parses."""
        fm = self._ahead.pop(path, None)
        if fm is not None:
            self._partial_of[(path, None)] = fm.text
            self._store((path, None), fm)

    def _needed(self, path: Path, qual: str) -> frozenset:
        """Top-level definitions of the file that `qual` reaches through calls within the file."""
        sheet = self.sheet(path)
        todo, seen = [qual.partition(".")[0]], set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            fns = [sheet["functions"][name]] if name in sheet["functions"] else list(
                sheet["classes"].get(name, {}).get("methods", {}).values())
            for fn in fns:
                for c in (*fn["calls"], *fn.get("refs", ())):
                    head = c.split(".", 1)[0]
                    if head in sheet["functions"] or head in sheet["classes"]:
                        todo.append(head)
        return frozenset(seen)

    def _blank_except(self, path: Path, text: str, keep: frozenset) -> str:
        sheet = self.sheet(path)
        lines = text.splitlines(keepends=True)
        for table in (sheet["functions"], sheet["classes"]):
            for name, d in table.items():
                if name in keep or "span" not in d:
                    continue
                a, b = d["span"]
                for i in range(a - 1, min(b, len(lines))):
                    ending = lines[i][len(lines[i].rstrip("\r\n")):]
                    lines[i] = ending
        return "".join(lines)

_IMPORT_LINE = re.compile(
    r"^[ \t]*(?:from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\*|\(?[\w., \t]+)|import[ \t]+([\w., \t]+))", re.M)


def quick_imports(text: str) -> list:
    """The fact-sheet form of a file's one-line imports, from the text alone (for files no rule would
    parse: do they import a project function that touches the model?)."""
    out = []
    for m in _IMPORT_LINE.finditer(text):
        dots, module, names, plain = m.groups()
        for part in (names or plain or "").strip("(").split(","):
            words = part.split()
            if not words:
                continue
            name, local = words[0], words[2] if len(words) == 3 and words[1] == "as" else None
            if plain is not None:
                out.append([local or name.split(".", 1)[0], name if local else name.split(".", 1)[0], None, 0])
            else:
                out.append([local or name, module, name, len(dots)])
    return out


def local_imports(collector) -> list:
    """The fact-sheet form of a parsed file's imports (from its libcst records, no second parse)."""
    out = []
    for local, qual in collector.resolver.names.items():
        mod, dot, attr = qual.rpartition(".")
        out.append([local, mod, attr, 0] if dot else [local, qual, None, 0])
    for node, _ in collector.import_froms:
        mod = _cst_dotted(node.module) if node.module is not None else ""
        if isinstance(node.names, cst.ImportStar):
            out.append([STAR, mod, STAR, len(node.relative)])
            continue
        if not node.relative:
            continue
        for a in node.names:
            name = a.name.value if isinstance(a.name, cst.Name) else (_cst_dotted(a.name) or "")
            local = a.asname.name.value if a.asname is not None and isinstance(a.asname.name, cst.Name) else name
            out.append([local, mod, name, len(node.relative)])
    return out


def _cst_dotted(node) -> str:
    from fsdplint.resolve import dotted

    return dotted(node) or ""


def locate(a, node) -> Optional[tuple]:
    """(Related location, call site in this file) for a node of another module of the project; None for
    a node of this file (or an event/node that cannot be placed)."""
    if node is None or id(node) in a.c.top or not getattr(a, "_foreign_mods", None):
        return None
    hit = a.foreign_site(node)
    if hit is None:
        return None
    fm, site, scope = hit
    start, end = fm.positions.range(node)
    where = f"in {scope.name}()" if scope is not None and scope.name != "<module>" else "at module level"
    text = fm.positions.line_text(start.row).strip()
    return Related(fm.display, start, end, f"{where}: {text}" if text else where), site


_PROJECTS: dict[tuple, Project] = {}
_ROOTS: dict[Path, Optional[Path]] = {}
# Files this process is going to lint (resolved paths), announced by the sequential run (`expect`).
_UPCOMING: set = set()
_RESOLVED: dict = {}  # a path `expect` was given -> its resolution
_POSITION: dict = {}  # a resolved path of `expect` -> its index in the paths given
_ELSEWHERE: set = set()  # files of the run that another process claimed (see `_claimed`)
_CLAIM: list = [None]  # `expect`'s claim: whether this process may lint the file at that index (None: all)


def expect(paths, claim=None) -> None:
    """Announce the files this process lints next: a module that another file's calls reach before its own
    turn is parsed whole once, and its lint reuses that parse and its records. With `claim` (a run shared by
    several worker processes), the file at index `i` of `paths` is parsed whole only when `claim(i)` gives it
    to this process, which then lints it (a worker that reaches a file first parses and lints it: the other
    one would parse it again); a file another process claimed is parsed in part, as any other module."""
    _UPCOMING.clear()  # what an earlier run left (interrupted) is not to come
    _RESOLVED.clear()
    _POSITION.clear()
    _ELSEWHERE.clear()
    _CLAIM[0] = claim
    for i, p in enumerate(paths):
        try:
            _RESOLVED[Path(p)] = resolved = Path(p).resolve()
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop
            continue
        _UPCOMING.add(resolved)
        _POSITION.setdefault(resolved, i)


def _claimed(path: Path) -> bool:
    """Whether the upcoming file is this process's to lint (always, without a claim); not, and it is no
    longer upcoming here."""
    claim = _CLAIM[0]
    if claim is None or claim(_POSITION[path]):
        return True
    _UPCOMING.discard(path)
    _ELSEWHERE.add(path)
    return False


def linted(path: Optional[Path]) -> None:
    """The file's turn is over: it is no longer parsed ahead (a parse made ahead of it stays on with the
    parts other files reached, see `Project.linted`)."""
    if path is None or not _UPCOMING:
        return
    resolved = _RESOLVED.pop(path, None)  # resolved once by `expect` (a resolution stats every component)
    try:
        path = resolved if resolved is not None else path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop
        return
    _UPCOMING.discard(path)
    for proj in _PROJECTS.values():
        proj.linted(path)


def project_for(path: Optional[Path], cache_dir: Optional[str] = None, use_cache: bool = True,
                linted_dir: Optional[str] = None) -> Optional[Project]:
    """The project `path` belongs to (None outside any project or for stdin without a file name).
    Without a project marker above the file, the directory given on the command line (`fsdplint .`)
    is the project when the file lies inside it: a checkout copied without its `.git` is still one job."""
    if path is None:
        return None
    try:
        d = path.parent.resolve()
        root = _ROOTS[d] if d in _ROOTS else _ROOTS.setdefault(d, find_root(path))
        if root is None:
            root = linted_root(d, linted_dir)
    except OSError:
        return None
    if root is None:
        return None
    key = (root, cache_dir, use_cache)
    proj = _PROJECTS.get(key)
    if proj is None:
        from fsdplint.analysis.cache import SheetCache

        cache = SheetCache.open(root, cache_dir) if use_cache else None
        proj = _PROJECTS[key] = Project(root, cache)
    proj.generation += 1
    return proj
