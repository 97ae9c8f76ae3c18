"""torchtune's `tune run [TORCHRUN OPTIONS] RECIPE --config CONFIG [key=value ...]`, and the spelling without
`run` that torchtune had before it (`tune [TORCHRUN OPTIONS] RECIPE --config CONFIG ...`, `torchtune/_cli/tune.py`
up to the commit that added `tune run`, 8fa0bbb, 2024-03-29).

`tune run` (torchtune `_cli/run.py`) runs a recipe by name: a name of torchtune's recipe registry
(`torchtune/_recipe_registry.py`, `Recipe(name=..., file_path=...)`, files under `recipes/`) or a path to a
recipe file; `--config` is a registry config name (`Config(name=..., file_path=...)` under
`recipes/configs/`) or a YAML path; the words after it are `key=value` overrides. With torchrun options
(`--nproc_per_node`, `--nnodes`) it runs the recipe through torchrun, without them in one process.

The registry is read from the project's own `torchtune/_recipe_registry.py` (linting torchtune itself);
elsewhere a recipe name of the installed package names no file of the project, so only paths bind. Before the
registry, `tune` resolved a recipe name `NAME` to `recipes/NAME.py` beside the `torchtune` package and a config
name to `recipes/configs/NAME.yaml`: a checkout of that age binds the same way.
"""

from __future__ import annotations

import ast
import os
from functools import lru_cache
from pathlib import Path
from typing import Optional

REGISTRY = ("torchtune", "_recipe_registry.py")
PACKAGE_INIT = ("torchtune", "__init__.py")
# `tune`'s own subcommands (every release): a word that is one of them is no recipe.
SUBCOMMANDS = frozenset({"run", "download", "ls", "cp", "validate", "cat", "convert_checkpoint"})
RECIPES_DIR = "recipes"
CONFIGS_DIR = ("recipes", "configs")


@lru_cache(maxsize=8)
def _read_registry(path: str, stamp: tuple) -> tuple[dict, dict]:
    """(recipe name -> file path under recipes/, config name -> file path under recipes/configs/)."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return {}, {}
    recipes: dict[str, str] = {}
    configs: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        kw = {k.arg: k.value.value for k in node.keywords
              if k.arg in ("name", "file_path") and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)}
        if "name" not in kw or "file_path" not in kw:
            continue
        if node.func.id == "Recipe":
            recipes[kw["name"]] = kw["file_path"]
        elif node.func.id == "Config":
            configs.setdefault(kw["name"], kw["file_path"])
    return recipes, configs


def registry_root(start: Path) -> Optional[Path]:
    """The directory above `start` (or `start` itself) that holds torchtune's recipe registry, or (a checkout
    from before the registry) the `torchtune` package beside a `recipes/` directory."""
    d = start.resolve()
    for _ in range(8):
        if d.joinpath(*REGISTRY).is_file() or (d.joinpath(*PACKAGE_INIT).is_file() and (d / RECIPES_DIR).is_dir()):
            return d
        if d.parent == d:
            return None
        d = d.parent
    return None


def registry(root: Path) -> tuple[dict, dict]:
    p = root.joinpath(*REGISTRY)
    try:
        st = p.stat()
    except OSError:
        return {}, {}
    return _read_registry(str(p), (st.st_mtime_ns, st.st_size))


def recipe_file(name: str, root: Optional[Path]) -> Optional[str]:
    """The recipe's file as a path relative to `root` (or as written, for a path): None when unknown."""
    if name.endswith(".py"):
        return name
    if root is None:
        return None
    rel = registry(root)[0].get(name)
    if rel is None and not root.joinpath(*REGISTRY).is_file() and (root / RECIPES_DIR / f"{name}.py").is_file():
        rel = f"{name}.py"  # before the registry: `recipes/NAME.py`
    return os.path.join(RECIPES_DIR, rel) if rel else None


def config_file(name: str, root: Optional[Path]) -> str:
    """A `--config` value as a path: a registry config's file under recipes/configs/, else as written."""
    if root is not None and not name.endswith((".yaml", ".yml")):
        rel = registry(root)[1].get(name)
        if rel is None and not root.joinpath(*REGISTRY).is_file() and root.joinpath(*CONFIGS_DIR, f"{name}.yaml").is_file():
            rel = f"{name}.yaml"  # before the registry: `recipes/configs/NAME.yaml`
        if rel:
            return os.path.join(*CONFIGS_DIR, rel)
    return name
