"""Cheap name resolution: imports and simple aliases → fully qualified names.

TorchFix gets this from libcst's Scope + QualifiedName providers, which cost
about 10x the parse. Training scripts bind API names through imports and plain
assignments, so a flow-insensitive table over those statements is enough.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst


def dotted(node: cst.BaseExpression) -> Optional[str]:
    """`a.b.c` for Name/Attribute chains, else None."""
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if isinstance(node, cst.Name):
        parts.append(node.value)
        return ".".join(reversed(parts))
    return None


def _module_name(node) -> str:
    return dotted(node) or ""


class Resolver:
    def __init__(self) -> None:
        # local name -> qualified name
        self.names: dict[str, str] = {}
        self.star_modules: list[str] = []

    # -- building -----------------------------------------------------------------
    def add_import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = _module_name(alias.name)
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.names[alias.asname.name.value] = full
            else:
                top = full.split(".", 1)[0]
                self.names.setdefault(top, top)

    def add_import_from(self, node: cst.ImportFrom, package: str = "") -> None:
        if node.relative:
            return  # the user's own package: never a library API
        mod = _module_name(node.module) if node.module is not None else ""
        if isinstance(node.names, cst.ImportStar):
            self.star_modules.append(mod)
            return
        for alias in node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else dotted(alias.name)
            local = alias.asname.name.value if alias.asname is not None and isinstance(alias.asname.name, cst.Name) else name
            self.names[local] = f"{mod}.{name}" if mod else name

    def add_alias(self, target: str, value: cst.BaseExpression) -> None:
        """`FSDP = torch.distributed.fsdp.FullyShardedDataParallel`-style aliases."""
        q = self.qualify(value)
        if q and q != target and "." in q:
            self.names.setdefault(target, q)

    # -- querying -------------------------------------------------------------------
    def qualify(self, node: cst.BaseExpression) -> Optional[str]:
        d = dotted(node)
        if d is None:
            return None
        head, dot, rest = d.partition(".")
        base = self.names.get(head)
        if base is None:
            return None
        return base + dot + rest if rest else base

    def qualify_star(self, name: str, api_table) -> Optional[str]:
        """For `from torch.distributed.fsdp import *`: try each star module."""
        for mod in self.star_modules:
            q = f"{mod}.{name}"
            if q in api_table:
                return q
        return None
