"""The names a module exports (its literal `__all__`), read from its `ast` alone.

A leaf: the launch side (which names a star import of an arguments module binds) and the analysis
(which names a star import of a project module binds) both read it.
"""

from __future__ import annotations

import ast
from typing import Optional


def dotted_name(node: ast.AST) -> Optional[str]:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def dunder_all(stmts) -> Optional[list]:
    """The names a literal module-level `__all__` lists (`=`, `+=`, `.extend`/`.append`); None when the
    module has none or builds it in a way a parse cannot read (then every public name counts)."""
    names: Optional[list] = None

    def strings(node) -> Optional[list]:
        if isinstance(node, (ast.List, ast.Tuple)) and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            return [e.value for e in node.elts]
        return None

    for node in stmts:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value, add = node.targets[0], node.value, False
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            target, value, add = node.target, node.value, isinstance(node, ast.AugAssign)
        elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
              and dotted_name(node.value.func) in ("__all__.extend", "__all__.append") and node.value.args):
            arg = node.value.args[0]
            more = strings(arg) if node.value.func.attr == "extend" else (
                [arg.value] if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None)
            if more is None or names is None:
                return None
            names += more
            continue
        if not (isinstance(target, ast.Name) and target.id == "__all__"):
            continue
        found = strings(value)
        if found is None or (add and names is None):
            return None
        names = (names if add else []) + found
    return names
