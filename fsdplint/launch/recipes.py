"""A lone recipe that fits a script's parser: a candidate launch when no launcher runs the script.

Projects often keep the job's values in a YAML/JSON beside the script (`recipes/qlora/config.yaml`,
`configs/sft.json`) and document the command elsewhere, or nowhere. A mapping file whose top-level keys
are (almost) all fields of the script's parser (its HfArgumentParser/TrlParser dataclasses, argparse
dests) is most likely such a recipe. Its values are only a guess at how the script runs, so every finding
that rests on them is at most a warning that names the file (see `fsdplint.launch.runs.merge_candidates`).

Looked for: the script's folder, and `recipes/`/`configs/` folders (a few levels deep) in the script's
folder, its parent and the project root. A file a launcher names is not lone: the launcher is read instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from fsdplint.launch.arguments import Definitions, read_mapping

SUFFIXES = (".yaml", ".yml", ".json")
RECIPE_DIRS = ("recipes", "configs", "config")
# A recipe fits when this share of its keys are parser fields, and at least this many are.
MIN_SHARE = 0.8
MIN_KEYS = 2
_MAX_DEPTH = 3
_MAX_FILES = 200
_MAX_BYTES = 256 * 1024
_SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "site-packages", "build", "dist"}


def _files_in(folder: Path, depth: int) -> list[Path]:
    out: list[Path] = []
    base = len(folder.parts)
    for d, dirs, names in os.walk(folder):
        dirs[:] = sorted(x for x in dirs if x not in _SKIP_DIRS and not x.startswith(".")
                         and len(Path(d).parts) - base < depth)
        out.extend(Path(d) / n for n in sorted(names) if n.endswith(SUFFIXES))
        if len(out) >= _MAX_FILES:
            break
    return out[:_MAX_FILES]


def nearby_files(script: Path, root: Path) -> list[Path]:
    """The YAML/JSON files a recipe for `script` may be: its own folder's, then those under a recipes/ or
    configs/ folder of the script's folder, its parent or the project root."""
    here = script.parent
    found: list[Path] = [p for p in sorted(here.iterdir()) if p.is_file() and p.name.endswith(SUFFIXES)] \
        if here.is_dir() else []
    for base in dict.fromkeys((here, here.parent, root)):
        for name in RECIPE_DIRS:
            d = base / name
            if d.is_dir():
                found.extend(_files_in(d, _MAX_DEPTH))
    return list(dict.fromkeys(Path(os.path.normpath(p)) for p in found))


def field_names(defs: Definitions) -> set[str]:
    return {name for g in defs.groups for name in g.fields}


def fits(keys: set[str], fields: set[str]) -> bool:
    """Exactly or mostly the parser's fields (a partial match is another file: a data or model config)."""
    if not keys:
        return False
    matched = len(keys & fields)
    return matched >= MIN_KEYS and matched / len(keys) >= MIN_SHARE


def lone_recipes(script: Path, root: Path, defs: Definitions, named: frozenset = frozenset()) -> list[Path]:
    """The recipes that fit the script's parser, none of them named by a launcher (`named`: resolved paths)."""
    fields = field_names(defs)
    if not fields:
        return []
    out = []
    for p in nearby_files(script, root):
        try:
            if p.stat().st_size > _MAX_BYTES or p.resolve() in named:
                continue
        except OSError:
            continue
        items = read_mapping(p)
        if items is not None and fits(set(items), fields):
            out.append(p)
    return out
