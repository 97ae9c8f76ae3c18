"""Meaning-preserving rewrites of training scripts, for the property tests.

Each takes source text and a `random.Random` (driven by hypothesis) and returns new source.
Renames and import aliasing keep every statement on its line; reordering and wrapping move
lines but keep each line's text (up to indentation).
"""

from __future__ import annotations

import random

import libcst as cst
from libcst.metadata import ParentNodeProvider


def _binding_names(module: cst.Module) -> set[str]:
    """Names the script binds itself (assignments, loop/with targets, parameters), not imports."""
    names: set[str] = set()

    class V(cst.CSTVisitor):
        def visit_AssignTarget(self, node):
            self._collect(node.target)

        def visit_For(self, node):
            self._collect(node.target)

        def visit_WithItem(self, node):
            if node.asname is not None:
                self._collect(node.asname.name)

        def visit_Param(self, node):
            names.add(node.name.value)

        def _collect(self, target):
            if isinstance(target, cst.Name):
                names.add(target.value)
            elif isinstance(target, (cst.Tuple, cst.List)):
                for el in target.elements:
                    self._collect(el.value)

    module.visit(V())
    return names - {"self", "cls", "__name__"}


def _imported_names(module: cst.Module) -> set[str]:
    names: set[str] = set()

    class V(cst.CSTVisitor):
        def visit_ImportAlias(self, node):
            if node.asname is not None:
                names.add(node.asname.name.value)
            else:
                names.add(cst.helpers.get_full_name_for_node(node.name).split(".")[0])

    module.visit(V())
    return names


class _RenameNames(cst.CSTTransformer):
    """Replace variable uses `old` with an expression; attribute names, keywords and imports stay."""

    METADATA_DEPENDENCIES = (ParentNodeProvider,)

    def __init__(self, mapping: dict[str, str]):
        self.mapping = mapping

    def leave_Name(self, original, updated):
        new = self.mapping.get(original.value)
        if new is None:
            return updated
        parent = self.get_metadata(ParentNodeProvider, original)
        if isinstance(parent, cst.Attribute) and parent.attr is original:
            return updated
        if isinstance(parent, cst.Arg) and parent.keyword is original:
            return updated
        if isinstance(parent, (cst.ImportAlias, cst.AsName, cst.ImportFrom, cst.Import)):
            return updated
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef)) and parent.name is original:
            return updated
        return cst.parse_expression(new)


def rename(src: str, mapping: dict[str, str]) -> str:
    return _rename(cst.parse_module(src), mapping).code


def _rename(module: cst.Module, mapping: dict[str, str]) -> cst.Module:
    return cst.MetadataWrapper(module).visit(_RenameNames(mapping))


def rename_variables(src: str, rng: random.Random, keep: frozenset = frozenset()) -> str:
    """Consistently rename some of the script's own variables (except `keep`) to fresh names."""
    module = cst.parse_module(src)
    candidates = sorted(_binding_names(module) - _imported_names(module) - set(keep))
    if not candidates:
        return src
    chosen = rng.sample(candidates, rng.randint(1, len(candidates)))
    return _rename(module, {name: f"v{i}_" for i, name in enumerate(chosen)}).code


def alias_imports(src: str, rng: random.Random) -> str:
    """`from M import a` -> `from M import a as a_alias` or `import M as m_mod` (uses become `m_mod.a`)."""
    module = cst.parse_module(src)
    mapping: dict[str, str] = {}
    counter = [0]

    class T(cst.CSTTransformer):
        def leave_ImportFrom(self, original, updated):
            if updated.relative or isinstance(updated.names, cst.ImportStar) or updated.module is None:
                return updated
            mod = cst.helpers.get_full_name_for_node(updated.module)
            if mod == "__future__":
                return updated
            if updated.lpar is None and rng.random() < 0.5:  # one line stays one line
                # import the module under an alias; every imported name becomes an attribute of it
                counter[0] += 1
                alias = f"mod{counter[0]}_"
                for a in updated.names:
                    local = a.asname.name.value if a.asname else a.name.value
                    mapping[local] = f"{alias}.{a.name.value}"
                return cst.Import(names=[cst.ImportAlias(name=updated.module, asname=cst.AsName(name=cst.Name(alias)))])
            names = []
            for a in updated.names:
                local = a.asname.name.value if a.asname else a.name.value
                new_local = f"{a.name.value}_alias"
                mapping[local] = new_local
                names.append(a.with_changes(asname=cst.AsName(name=cst.Name(new_local))))
            return updated.with_changes(names=names)

    module = module.visit(T())
    # Imports inside functions may shadow each other: only rewrite names bound once.
    return _rename(module, mapping).code if mapping else module.code


def _top_level_runs(module: cst.Module, kinds) -> list[tuple[int, int]]:
    """[start, end) index ranges of consecutive top-level statements of the given kinds."""
    runs, start = [], None
    for i, stmt in enumerate(list(module.body) + [None]):
        ok = stmt is not None and kinds(stmt)
        if ok and start is None:
            start = i
        elif not ok and start is not None:
            if i - start > 1:
                runs.append((start, i))
            start = None
    return runs


def _is_import(stmt) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], (cst.Import, cst.ImportFrom))
            and not (isinstance(stmt.body[0], cst.ImportFrom) and stmt.body[0].module is not None
                     and cst.helpers.get_full_name_for_node(stmt.body[0].module) == "__future__"))


def _is_def(stmt) -> bool:
    return isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and not stmt.decorators


def reorder_independent(src: str, rng: random.Random) -> str:
    """Shuffle runs of top-level imports (distinct names) and of undecorated top-level defs/classes."""
    module = cst.parse_module(src)
    body = list(module.body)
    for kinds in (_is_import, _is_def):
        for start, end in _top_level_runs(module, kinds):
            run = body[start:end]
            rng.shuffle(run)
            # Comments above a statement travel with it, but the first line's blank-line
            # layout belongs to its position.
            body[start:end] = run
    return module.with_changes(body=body).code


def wrap_in_main_guard(src: str, rng: random.Random) -> str:
    """Put everything after the docstring and `__future__` imports under `if __name__ == "__main__":`."""
    module = cst.parse_module(src)
    body = list(module.body)
    head = 0
    while head < len(body) and (
        (isinstance(body[head], cst.SimpleStatementLine) and isinstance(body[head].body[0], cst.Expr)
         and isinstance(body[head].body[0].value, cst.SimpleString) and head == 0)
        or (isinstance(body[head], cst.SimpleStatementLine) and isinstance(body[head].body[0], cst.ImportFrom)
            and body[head].body[0].module is not None
            and cst.helpers.get_full_name_for_node(body[head].body[0].module) == "__future__")
    ):
        head += 1
    if head == len(body):
        return src
    guard = cst.If(test=cst.parse_expression('__name__ == "__main__"'), body=cst.IndentedBlock(body=body[head:]))
    return module.with_changes(body=body[:head] + [guard]).code


def wrap_in_function(src: str, rng: random.Random) -> str:
    """Put everything after the docstring into `def _script():` and call it."""
    module = cst.parse_module(src)
    body = list(module.body)
    head = 1 if body and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Expr) else 0
    if head == len(body):
        return src
    fn = cst.FunctionDef(name=cst.Name("_script"), params=cst.Parameters(), body=cst.IndentedBlock(body=body[head:]))
    call = cst.parse_statement("_script()\n")
    return module.with_changes(body=body[:head] + [fn, call]).code


ODD_VALUES = ("None", "-1", "0", "1.5", "'s'", "''", "[]", "{}", "[None]", "{'a': 1}", "('x',)", "True",
              "[[1]]", "'all-linear'", "{'q_proj'}", "f()", "lambda m: True", "...", "2**100", "torch.uint8")


def replace_keyword_values(src: str, rng: random.Random) -> str:
    """Not meaning-preserving: give some keyword arguments odd values (None, numbers, nested lists...)."""
    module = cst.parse_module(src)
    count = [0]

    class Count(cst.CSTVisitor):
        def visit_Arg(self, node):
            count[0] += node.keyword is not None

    module.visit(Count())
    if not count[0]:
        return src
    chosen = set(rng.sample(range(count[0]), min(count[0], rng.randint(1, 4))))
    seen = [-1]

    class T(cst.CSTTransformer):
        def leave_Arg(self, original, updated):
            if updated.keyword is None:
                return updated
            seen[0] += 1
            if seen[0] not in chosen:
                return updated
            return updated.with_changes(value=cst.parse_expression(rng.choice(ODD_VALUES)))

    return module.visit(T()).code


def argparse_flags(src: str, rng: random.Random) -> str:
    """Pass literal keyword values through argparse flags whose defaults are those values:
    `BitsAndBytesConfig(load_in_4bit=True)` -> `BitsAndBytesConfig(load_in_4bit=_flags_.load_in_4bit_1)`
    with `--no_load_in_4bit_1` (store_false, default True) added to a parser. The parser is appended to
    the first top-level import line, so every other line keeps its number and text position."""
    module = cst.parse_module(src)
    first = next((i for i, s in enumerate(module.body) if isinstance(s, cst.SimpleStatementLine)
                  and any(isinstance(x, (cst.Import, cst.ImportFrom)) for x in s.body)), None)
    if first is None:
        return src
    flags: list[str] = []

    class Swap(cst.CSTTransformer):
        def __init__(self) -> None:
            self.n = 0
            self.calls: list[bool] = []

        def visit_Call(self, node) -> None:
            # the script's own parser keeps its arguments
            self.calls.append(isinstance(node.func, cst.Attribute) and node.func.attr.value == "add_argument")

        def leave_Arg(self, original, updated):
            if updated.keyword is None or updated.star or (self.calls and self.calls[-1]) or rng.random() < 0.4:
                return updated
            v = updated.value
            name = f"{updated.keyword.value}_{self.n + 1}"
            if isinstance(v, cst.Name) and v.value in ("True", "False"):
                flags.append(f'_p_.add_argument("--no_{name}", dest="{name}", action="store_false")' if v.value == "True"
                             else f'_p_.add_argument("--{name}", action="store_true")')
            elif isinstance(v, cst.Integer):
                flags.append(f'_p_.add_argument("--{name}", type=int, default={v.value})')
            elif isinstance(v, cst.Float):
                flags.append(f'_p_.add_argument("--{name}", type=float, default={v.value})')
            elif isinstance(v, cst.SimpleString) and isinstance(v.evaluated_value, str) and "\n" not in v.value:
                flags.append(f'_p_.add_argument("--{name}", default={v.value})')
            else:
                return updated
            self.n += 1
            return updated.with_changes(value=cst.parse_expression(f"_flags_.{name}"))

        def leave_Call(self, original, updated):
            self.calls.pop()
            return updated

    body = list(module.body)
    rest = cst.Module(body=body[first + 1:]).visit(Swap())
    if not flags:
        return src
    parser = ["import argparse as _argparse_", "_p_ = _argparse_.ArgumentParser()", *flags,
              "_flags_ = _p_.parse_args()"]
    extra = [cst.parse_statement(s).body[0] for s in parser]
    line = body[first]
    body[first] = line.with_changes(body=[*[x.with_changes(semicolon=cst.MaybeSentinel.DEFAULT) for x in line.body],
                                          *extra])
    return module.with_changes(body=[*body[:first + 1], *rest.body]).code


# -- refactorings real projects go through (the project view must keep the findings) ----------------

_LOADERS = ("from_pretrained",)
_WRAPPERS = ("FSDP", "FullyShardedDataParallel", "fully_shard", "get_peft_model", "prepare_model_for_kbit_training")


def _call_name(expr) -> str:
    if isinstance(expr, cst.Call):
        f = expr.func
        return f.attr.value if isinstance(f, cst.Attribute) else f.value if isinstance(f, cst.Name) else ""
    return ""


def _candidates(module: cst.Module, names) -> list[tuple]:
    """(block owner, index, statement) for `X = call(...)` / `call(...)` statements directly in the module
    body or a top-level function body, whose call is one of `names`."""
    out = []
    owners = [(None, module.body)] + [(s, s.body.body) for s in module.body
                                      if isinstance(s, cst.FunctionDef) and isinstance(s.body, cst.IndentedBlock)]
    for owner, body in owners:
        for i, stmt in enumerate(body):
            if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
                continue
            small = stmt.body[0]
            value = small.value if isinstance(small, (cst.Assign, cst.Expr)) else None
            if isinstance(small, cst.Assign) and not (len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name)):
                continue
            if _call_name(value) in names:
                out.append((owner, i, stmt))
    return out


def _free_names(stmt, imported: set[str]) -> list[str]:
    names: list[str] = []

    class V(cst.CSTVisitor):
        def visit_Attribute(self, node):
            node.value.visit(self)
            return False

        def visit_Arg(self, node):
            node.value.visit(self)
            return False

        def visit_Name(self, node):
            if node.value not in imported and node.value not in names and node.value not in ("True", "False", "None"):
                names.append(node.value)

    value = stmt.body[0].value
    value.visit(V())
    return names


def _extract(src: str, rng: random.Random, names, expression: bool = False) -> tuple[str, str, str]:
    """Move one statement into a helper `def _helper_(...)` that returns what it binds (`expression`: that
    returns the call itself, `return get_peft_model(model, cfg)`).
    Returns (script, helper source, helper name); the script unchanged (and no helper) when nothing fits."""
    module = cst.parse_module(src)
    found = _candidates(module, names)
    if not found:
        return src, "", ""
    owner, index, stmt = rng.choice(found)
    small = stmt.body[0]
    params = _free_names(stmt, _imported_names(module) | {"self"})
    args = ", ".join(params)
    if isinstance(small, cst.Assign):
        target = small.targets[0].target.value
        params = [p for p in params]
        value = module.code_for_node(small.value)
        helper = (f"def _helper_({args}):\n    return {value}\n" if expression else
                  f"def _helper_({args}):\n    {target} = {value}\n    return {target}\n")
        call = cst.parse_statement(f"{target} = _helper_({args})\n")
    else:
        helper = f"def _helper_({args}):\n    {module.code_for_node(small.value)}\n"
        call = cst.parse_statement(f"_helper_({args})\n")
    call = call.with_changes(leading_lines=stmt.leading_lines)

    class T(cst.CSTTransformer):
        def leave_SimpleStatementLine(self, original, updated):
            return call if original is stmt else updated

    return module.visit(T()).code, helper, "_helper_"


def _imports_of(src: str) -> str:
    module = cst.parse_module(src)
    return "".join(module.code_for_node(s) for s in module.body if _is_import(s)
                   or (isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.ImportFrom)))


def extract_helper(src: str, rng: random.Random, expression: bool = False) -> str:
    """Extract the model's loading, LoRA injection or wrapping into a helper of the same file that
    returns the model (`model = _helper_(name, cfg)`); `expression`: the helper returns the call."""
    script, helper, _ = _extract(src, rng, _LOADERS + _WRAPPERS, expression)
    if not helper:
        return src
    module = cst.parse_module(script)
    body = list(module.body)
    at = 0
    while at < len(body) and (_is_import(body[at]) or (isinstance(body[at], cst.SimpleStatementLine)
                                                        and isinstance(body[at].body[0], (cst.ImportFrom, cst.Expr)))):
        at += 1
    body.insert(at, cst.parse_statement(helper))
    return module.with_changes(body=body).code


def move_helper_to_module(src: str, rng: random.Random, expression: bool = False) -> dict[str, str]:
    """Extract as `extract_helper`, into another module of a package: {"model_utils.py": ..., "train.py": ...}
    where train.py imports it relatively (`from .model_utils import _helper_`)."""
    script, helper, name = _extract(src, rng, _LOADERS + _WRAPPERS, expression)
    if not helper:
        return {"train.py": src}
    module = cst.parse_module(script)
    body = list(module.body)
    at = 0
    while at < len(body) and isinstance(body[at], cst.SimpleStatementLine) and isinstance(
            body[at].body[0], (cst.ImportFrom, cst.Import, cst.Expr)):
        at += 1
    body.insert(at, cst.parse_statement(f"from .model_utils import {name}\n"))
    return {"model_utils.py": _imports_of(src) + "\n\n" + helper, "train.py": module.with_changes(body=body).code}


def second_name(src: str, rng: random.Random) -> str:
    """After the model is loaded (`model = X.from_pretrained(...)`), give it a second name and use only that
    from then on in the same block."""
    module = cst.parse_module(src)
    found = [c for c in _candidates(module, _LOADERS) if isinstance(c[2].body[0], cst.Assign)]
    if not found:
        return src
    owner, index, stmt = rng.choice(found)
    name = stmt.body[0].targets[0].target.value
    alias = f"{name}_2nd"
    body = list(owner.body.body if owner is not None else module.body)
    rest = [_rename_node(s, {name: alias}) for s in body[index + 1:]]
    new_body = body[:index + 1] + [cst.parse_statement(f"{alias} = {name}\n")] + rest
    if owner is None:
        return module.with_changes(body=new_body).code

    class T(cst.CSTTransformer):
        def leave_FunctionDef(self, original, updated):
            return updated.with_changes(body=updated.body.with_changes(body=new_body)) if original is owner else updated

    return module.visit(T()).code


def _rename_node(stmt, mapping):
    """`_RenameNames` over one statement (wrapped in a module for the parent metadata)."""
    mod = cst.Module(body=[stmt])
    return _rename(mod, mapping).body[0]


def into_class(src: str, rng: random.Random) -> str:
    """Turn the top-level script into a trainer class: its statements run in `__init__`, with the model
    kept as `self.model`; the class is instantiated where the script ran."""
    module = cst.parse_module(src)
    body = list(module.body)
    keep = [s for s in body if _is_import(s) or isinstance(s, (cst.FunctionDef, cst.ClassDef))
            or (isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], (cst.ImportFrom, cst.Import)))]
    moved = [s for s in body if s not in keep]
    if not moved or "model" not in _binding_names(cst.Module(body=moved)):
        return src
    if body and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Expr) and body[0] in moved:
        moved = moved[1:]
        keep = [body[0]] + keep
    renamed = _rename(cst.Module(body=moved), {"model": "self.model"}).body
    cls = cst.ClassDef(name=cst.Name("Job_"), body=cst.IndentedBlock(body=[cst.FunctionDef(
        name=cst.Name("__init__"), params=cst.Parameters(params=[cst.Param(cst.Name("self"))]),
        body=cst.IndentedBlock(body=list(renamed)))]))
    return module.with_changes(body=keep + [cls, cst.parse_statement("Job_()\n")]).code
