"""The engine's modules form no import cycle (lazy imports included; `TYPE_CHECKING` blocks excluded)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "fsdplint"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, modules) -> set[str]:
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("fsdplint"):
                # `from pkg import submodule` depends on the submodule (and on pkg/__init__ only otherwise).
                for a in child.names:
                    sub = f"{child.module}.{a.name}"
                    out.add(sub if sub in modules else child.module)
            elif isinstance(child, ast.Import):
                out.update(a.name for a in child.names if a.name.startswith("fsdplint"))
            visit(child)

    visit(tree)
    return out


def _with_packages(name: str, deps: set[str], modules) -> set[str]:
    """Importing `pkg.sub` from outside `pkg` runs `pkg/__init__.py` first, and everything it imports:
    a module depends on the packages of what it imports (a sibling inside the package does not: the package
    is already being initialised when it runs)."""
    out = set(deps)
    for d in deps:
        parts = d.split(".")
        for k in range(1, len(parts)):
            pkg = ".".join(parts[:k])
            if pkg in modules and name != pkg and not name.startswith(pkg + "."):
                out.add(pkg)
    return out


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = {d for d in _imports(ast.parse(path.read_text()), modules) if d in modules and d != name}
        graph[name] = _with_packages(name, deps, modules)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(n: str) -> list[str]:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = dfs(d)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return []

    for n in sorted(graph):
        if n not in state:
            found = dfs(n)
            if found:
                return found
    return []


def test_engine_modules_have_no_import_cycle():
    graph = _graph()
    assert "fsdplint.config" in graph and "fsdplint.analysis.script" in graph
    cycle = _cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_cycle_finder_sees_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_a_cycle_through_a_package_init_is_seen():
    # `pkg/__init__.py` imports pkg.a, pkg.a imports `other` lazily, `other` imports pkg.b: importing `other`
    # first runs pkg/__init__.py, which imports pkg.a, which needs `other` half-initialised.
    modules = {"pkg", "pkg.a", "pkg.b", "other"}
    graph = {"pkg": {"pkg.a"}, "pkg.a": {"other"}, "pkg.b": set(),
             "other": _with_packages("other", {"pkg.b"}, modules)}
    assert _cycle(graph) == ["other", "pkg", "pkg.a", "other"]
    # A sibling inside the package importing another is not a cycle.
    assert _with_packages("pkg.a", {"pkg.b"}, modules) == {"pkg.b"}


def test_lazy_imports_inside_functions_count():
    tree = ast.parse("def f():\n    from fsdplint.launch.arguments import ArgEnv\n")
    assert _imports(tree, {"fsdplint.launch.arguments"}) == {"fsdplint.launch.arguments"}


# What turns a project into launches sits below what reads scripts: the launch package never imports the
# analysis, the engine, the rules, the audit, the run or the output, even lazily (else launch knowledge
# would again depend on the code that consumes it).
LAUNCH_FLOOR = ("fsdplint.analysis", "fsdplint.engine", "fsdplint.rules", "fsdplint.audit", "fsdplint.run",
                "fsdplint.output", "fsdplint.context", "fsdplint.cli")


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        n = todo.pop()
        for d in graph.get(n, ()):
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def _banned(name: str) -> bool:
    return any(name == b or name.startswith(b + ".") for b in LAUNCH_FLOOR)


def test_launch_package_sits_below_the_analysis():
    graph = _graph()
    launch = sorted(n for n in graph if n == "fsdplint.launch" or n.startswith("fsdplint.launch."))
    assert "fsdplint.launch.shell" in launch and "fsdplint.launch.tools.axolotl" in launch
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    bad = {}
    for name in launch:
        # Direct imports, including those of modules outside the graph (the rules ship from rules/).
        direct = _imports(ast.parse(modules[name].read_text()), modules)
        hits = sorted(d for d in direct | _reachable(graph, name) if _banned(d))
        if hits:
            bad[name] = hits
    assert not bad, f"the launch package imports above its floor: {bad}"


def test_floor_check_sees_a_lazy_import_of_the_rules():
    tree = ast.parse("def f():\n    from fsdplint.rules._lora_targets import X\n")
    assert any(_banned(d) for d in _imports(tree, set()))
