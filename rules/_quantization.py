"""4-bit configs built by a library function rather than a `BitsAndBytesConfig(...)` the script writes.

trl's `get_quantization_config(model_args)` returns `BitsAndBytesConfig(load_in_4bit=True, ...)` when
`model_args.load_in_4bit`, with `bnb_4bit_quant_storage` taken from a field that depends on the trl release
(apis.RETURNED_CONFIGS). The flags come from the command line, a recipe or a dataclass default, so the
script's own text says nothing about 4-bit: only the value analysis does. One reader for FSDP201 and FSDP202.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import libcst as cst

from fsdplint import behaviour
from fsdplint.apis import RETURNED_CONFIGS
from fsdplint.analysis import UNKNOWN
from fsdplint.collect import Call
from fsdplint.resolve import dotted


@dataclass
class LibraryQuant:
    call: Call  # the library call
    storage: Any  # the storage dtype's value, None for bitsandbytes' default (uint8), UNKNOWN when not known
    behaviour: Optional[str]  # the behaviour.py entry for the target release (None: the release is unknown)
    field: Optional[str]  # the argument's field the storage comes from (None: none is passed)
    # "file:line" of the function in the linted tree when the tree is that library (its source decides, not
    # the release table).
    source: Optional[str] = None

    @property
    def node(self):
        return self.call.node


def library_4bit_configs(ctx, a) -> list[LibraryQuant]:
    """Calls of the library functions of apis.RETURNED_CONFIGS that build a BitsAndBytesConfig and whose
    argument's values ask for 4 bits, with the storage the target release of that library gives it."""
    out = []
    for api, (kind, fields, by_version) in RETURNED_CONFIGS.items():
        if kind != "BitsAndBytesConfig":
            continue
        for call in a.calls(api):
            source = dotted(call.arg(0, "model_args") or call.arg(0, "model_config"))
            if source is None:
                continue

            def read(spec, source=source, call=call):
                return a.value(cst.parse_expression(f"{source}.{spec[1]}"), call.scope)

            if read(fields["load_in_4bit"]) is not True:
                continue
            own = _own_definition(ctx, api)
            if own is not None:
                where, spec = own
                if spec is not None:
                    out.append(LibraryQuant(call, None if spec[0] == "absent" else read(spec), None,
                                            spec[1] if spec[0] == "arg_attr" else None, where))
                continue
            chosen = next(((key, f) for key, f in by_version
                           if behaviour.holds(key, ctx.version(behaviour.BEHAVIOURS[key].package))), None)
            if chosen is None:  # the release is unknown: which storage it sets cannot be told
                out.append(LibraryQuant(call, UNKNOWN, None, None))
                continue
            key, f = chosen
            spec = f["bnb_4bit_quant_storage"]
            if spec[0] == "absent":
                out.append(LibraryQuant(call, None, key, None))
            else:
                out.append(LibraryQuant(call, read(spec), key, spec[1]))
    return out


def _own_definition(ctx, api: str):
    """When the linted tree is the library itself (it holds, at the path of one of `api`'s qualified names,
    the module that defines the function: `trl/trainer/utils.py` with `def get_quantization_config`), the
    script's import runs the tree's function, not a release's: returns
    ("file:line", storage spec) read from its source — `("absent",)` when its 4-bit `BitsAndBytesConfig(...)`
    passes no `bnb_4bit_quant_storage`, `("arg_attr", field)` for `<first parameter>.<field>`, None when it
    cannot be read. None when the tree does not define the function (the release table decides)."""
    import ast

    from fsdplint.apis import QUALIFIED

    project = getattr(ctx, "project", None)
    root = getattr(project, "root", None)
    if root is None:
        return None
    cache = ctx.__dict__.setdefault("_own_definitions", {})
    if api in cache:
        return cache[api]
    cache[api] = None
    for qual in sorted(QUALIFIED.get(api, ()), key=lambda q: -q.count(".")):  # the defining module first
        *mod, name = qual.split(".")
        if len(mod) < 2:
            continue  # a name re-exported by the package's __init__ says nothing of where it is defined
        path = None
        for base in (root, root / "src"):
            stem = base.joinpath(*mod)
            for cand in (stem.with_name(stem.name + ".py"), stem / "__init__.py"):
                if cand.is_file():
                    path = cand
                    break
            if path is not None:
                break
        if path is None:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (OSError, SyntaxError, ValueError):
            continue
        fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if fn is None:
            continue
        rel = path.relative_to(root).as_posix()
        cache[api] = (f"{rel}:{fn.lineno}", _storage_spec(fn))
        return cache[api]
    return None


def _storage_spec(fn):
    """The storage spec of the 4-bit `BitsAndBytesConfig(...)` that function `fn` builds (see _own_definition)."""
    import ast

    param = fn.args.args[0].arg if fn.args.args else None
    specs = set()
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Call) and (getattr(node.func, "id", None) or getattr(node.func, "attr", None))
                == "BitsAndBytesConfig"):
            continue
        kws = {k.arg: k.value for k in node.keywords if k.arg}
        if None in [k.arg for k in node.keywords] or "load_in_4bit" not in kws:
            continue  # (an 8-bit config, or one built from **kwargs)
        v = kws.get("bnb_4bit_quant_storage")
        if v is None:
            specs.add(("absent",))
        elif isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == param:
            specs.add(("arg_attr", v.attr))
        else:
            return None
    return specs.pop() if len(specs) == 1 else None


def unknown_choice(a, call):
    """The `if`/`elif` of a choice (it has another branch) that a quantization step (an 8-bit load, a k-bit
    preparation) sits in, when its test's value
    is not known here (`elif train_config.quantization == "8bit":` with the value set from the command line)."""
    guards = list(call.guards)
    for g in reversed(guards):  # innermost first: the `elif` that picks 8-bit, not the `if` before it
        test = getattr(g.node, "test", None)
        if g.branch != "body" or test is None or g.loop_depth:
            continue
        is_elif = any(o.branch == "orelse" and getattr(o.node, "orelse", None) is g.node for o in guards)
        if (is_elif or getattr(g.node, "orelse", None) is not None) and UNKNOWN in a.truth(test, call.scope):
            return g
    return None
