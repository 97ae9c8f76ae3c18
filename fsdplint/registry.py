"""Discovers the rule classes: one file per rule under `rules/`.

In a source checkout the rules live in `<repo>/rules`; a built wheel ships them
as the package `fsdplint.rules`. Both load under the module name `fsdplint.rules.*`.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from pathlib import Path

from fsdplint.rule import Rule

_PACKAGE = "fsdplint.rules"


def rules_dir() -> Path:
    here = Path(__file__).resolve().parent
    installed = here / "rules"
    return installed if installed.is_dir() else here.parent / "rules"


def _load_package() -> types.ModuleType:
    pkg = sys.modules.get(_PACKAGE)
    if pkg is None:
        pkg = types.ModuleType(_PACKAGE)
        pkg.__path__ = [str(rules_dir())]
        sys.modules[_PACKAGE] = pkg
    return pkg


@functools.lru_cache(maxsize=None)
def all_rules() -> tuple[type[Rule], ...]:
    _load_package()
    found: dict[str, type[Rule]] = {}
    for path in sorted(rules_dir().glob("fsdp*.py")):
        modname = f"{_PACKAGE}.{path.stem}"
        module = sys.modules.get(modname)
        if module is None:
            spec = importlib.util.spec_from_file_location(modname, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[modname] = module
            spec.loader.exec_module(module)
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Rule) and obj is not Rule and obj.__module__ == modname:
                if obj.code in found:
                    raise RuntimeError(f"duplicate rule code {obj.code} in {path.name}")
                found[obj.code] = obj
    return tuple(sorted(found.values(), key=lambda r: r.code))


@functools.lru_cache(maxsize=None)
def rules_by_code() -> dict[str, type[Rule]]:
    return {r.code: r for r in all_rules()}


def get_rule(code: str) -> type[Rule] | None:
    code = code.upper()
    by_code = rules_by_code()
    if code in by_code:
        return by_code[code]
    for r in all_rules():
        if r.name == code.lower():
            return r
    return None


def select_codes(select=None, ignore=None, extend_select=None) -> set[str]:
    """Ruff-style selection: codes or prefixes (`FSDP2`, `FSDP`, `ALL`)."""
    codes = [r.code for r in all_rules()]

    def expand(patterns):
        out = set()
        for p in patterns or ():
            p = p.strip().upper()
            if not p:
                continue
            if p == "ALL":
                out.update(codes)
            else:
                out.update(c for c in codes if c.startswith(p))
        return out

    chosen = expand(select) if select else set(codes)
    chosen |= expand(extend_select)
    chosen -= expand(ignore)
    return chosen


def unknown_selectors(patterns) -> list[str]:
    codes = [r.code for r in all_rules()]
    bad = []
    for p in patterns or ():
        q = p.strip().upper()
        if q and q != "ALL" and not any(c.startswith(q) for c in codes):
            bad.append(p)
    return bad
