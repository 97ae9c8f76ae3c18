"""Which accelerate config (and which tool YAML or script) a project's shell launchers name.

A stopgap reader: it scans `*.sh` files with a regular expression for `accelerate ... --config_file PATH` and the
other `.yaml`/`.yml`/`.py` paths on the same command line (backslash continuations joined). The
shell-launcher parser (one lint per launch, with flags and variables) is meant to replace it; until
then this covers the common `accelerate launch --config_file configs/fsdp.yaml train.py cfg.yaml`.
Paths are resolved against the launcher's directory first, then the project root.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

_CONFIG_FLAG = re.compile(r"""--config[_-]file(?:=|\s+)(["']?)([^\s"'$`;|&]+)\1""")
_PATH_TOKEN = re.compile(r"""(?<![\w$/.-])(["']?)([^\s"'$`;|&=]+\.(?:ya?ml|py))\1(?=\s|$|;)""")
_SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", ".tox", "site-packages", "build", "dist"}
_MAX_FILES = 200
_MAX_DIRS = 2000
_MAX_DEPTH = 6


@dataclass(frozen=True)
class LaunchLine:
    launcher: Path
    line: int  # 1-based line of the command in the launcher
    config: Path  # the accelerate config
    named: tuple = field(default_factory=tuple)  # other files on the command line (resolved)
    # (key, value, row) flags of a LLaMA-Factory entry point on the same command line.
    llamafactory_args: tuple = field(default_factory=tuple)


def _launchers(root: Path) -> list[Path]:
    out: list[Path] = []
    depth0 = len(root.parts)
    walked = 0
    for d, dirs, names in os.walk(root):
        walked += 1
        if walked > _MAX_DIRS:
            break
        if len(Path(d).parts) - depth0 >= _MAX_DEPTH:
            dirs[:] = []
        dirs[:] = sorted(x for x in dirs if x not in _SKIP_DIRS and not x.startswith("."))
        for n in sorted(names):
            if n.endswith((".sh", ".bash")):
                out.append(Path(d) / n)
                if len(out) >= _MAX_FILES:
                    return out
    return out


def _logical_lines(text: str):
    """(first row, command text, [(offset, row)...]) per command, backslash continuations joined."""
    start, buf, rows = 1, "", []
    for i, line in enumerate(text.splitlines(), 1):
        if not buf:
            start, rows = i, []
        stripped = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        rows.append((len(buf), i))
        if stripped.rstrip().endswith("\\"):
            buf += stripped.rstrip()[:-1] + " "
            continue
        yield start, buf + stripped, rows
        buf = ""
    if buf:
        yield start, buf, rows


def _row_at(rows, offset: int) -> int:
    row = rows[0][1]
    for off, r in rows:
        if off <= offset:
            row = r
    return row


# LLaMA-Factory entry points whose `--key value` flags are its HfArgumentParser arguments.
_LF_ENTRY = re.compile(r"(?:train_bash\.py|src/train\.py|llamafactory-cli\s+train|-m\s+(?:llamafactory|llmtuner)\b)")
_FLAG = re.compile(r"--([A-Za-z_][\w.-]*)(?:=(\S+))?")


def _flags(line: str, rows, start: int) -> tuple:
    """(key, value, row) of the `--key value` / `--key=value` / bare `--flag` tokens after `start`."""
    out = []
    tokens = [(m.start() + start, m.group(0)) for m in re.finditer(r"\S+", line[start:])]
    i = 0
    while i < len(tokens):
        off, tok = tokens[i]
        m = _FLAG.fullmatch(tok)
        i += 1
        if not m:
            continue
        key, value = m.group(1), m.group(2)
        if value is None:
            if i < len(tokens) and not tokens[i][1].startswith("--"):
                value = tokens[i][1]
                i += 1
            else:
                value = True
        out.append((key, value.strip("\"'") if isinstance(value, str) else value, _row_at(rows, off)))
    return tuple(out)


def _resolve(token: str, launcher: Path, root: Path) -> Optional[Path]:
    for base in (launcher.parent, root):
        p = (base / token) if not os.path.isabs(token) else Path(token)
        try:
            if p.is_file():
                return Path(os.path.normpath(p))
        except OSError:
            continue
    return None


@lru_cache(maxsize=64)
def launch_lines(root: Path) -> tuple[LaunchLine, ...]:
    out = []
    for sh in _launchers(root):
        try:
            text = sh.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "config_file" not in text and "config-file" not in text:
            continue
        for row, line, rows in _logical_lines(text):
            m = _CONFIG_FLAG.search(line)
            if not m or "accelerate" not in line[:m.start()]:
                continue  # `--config_file` of some other program
            cfg = _resolve(m.group(2), sh, root)
            if cfg is None or cfg.suffix not in (".yaml", ".yml"):
                continue
            rest = line[:m.start()] + " " + line[m.end():]
            named = tuple(p for p in (_resolve(t.group(2), sh, root) for t in _PATH_TOKEN.finditer(rest)) if p)
            entry = _LF_ENTRY.search(line, m.end())
            lf = _flags(line, rows, entry.end()) if entry else ()
            out.append(LaunchLine(sh, row, cfg, named, lf))
    return tuple(out)


def _display(p: Path) -> Path:
    """`p` relative to the working directory when it lies below it (as findings name files)."""
    try:
        return Path(os.path.relpath(p)) if Path(p).resolve().is_relative_to(Path.cwd().resolve()) else p
    except (OSError, ValueError):
        return p


def accelerate_configs_named_by(project_root: Path) -> list[Path]:
    """Every accelerate config a `*.sh` launcher under `project_root` passes with `--config_file`."""
    seen: dict[Path, None] = {}
    for ll in launch_lines(Path(os.path.normpath(Path(project_root).resolve()))):
        seen.setdefault(ll.config)
    return [_display(p) for p in seen]


def configs_for(path: Path, project_root: Path) -> list[Path]:
    """The accelerate configs named on launcher lines that also name `path` (a script or tool YAML)."""
    target = Path(os.path.normpath(Path(path).resolve()))
    out: dict[Path, None] = {}
    for ll in launch_lines(Path(os.path.normpath(Path(project_root).resolve()))):
        if any(Path(os.path.normpath(p.resolve())) == target for p in ll.named):
            out.setdefault(ll.config)
    return [_display(p) for p in out]


def lines_naming_config(config: Path, project_root: Path) -> list[LaunchLine]:
    """The launcher command lines that pass `config` with --config_file."""
    target = Path(os.path.normpath(Path(config).resolve()))
    return [ll for ll in launch_lines(Path(os.path.normpath(Path(project_root).resolve())))
            if Path(os.path.normpath(ll.config.resolve())) == target]


def project_root(path: Path) -> Path:
    """The nearest directory above `path` with .git, pyproject.toml, setup.py or setup.cfg; else
    the directory of `path` itself (or its parent when it has no launcher)."""
    start = Path(path).resolve()
    d = start if start.is_dir() else start.parent
    for cand in (d, *d.parents):
        if any((cand / m).exists() for m in (".git", "pyproject.toml", "setup.py", "setup.cfg")):
            return cand
    return d


def search_root(path: Path, linted: Optional[str] = None) -> Path:
    """Where the launchers of `path`'s project are looked for: the nearest project marker above it, so the
    answer does not depend on which folder was named on the command line; only a tree with no marker
    falls back to the linted directory (then `path`'s own directory)."""
    from fsdplint.roots import find_root, linted_root

    start = Path(path).resolve()
    found = find_root(start)
    if found is not None:
        return found
    lr = linted_root(start if start.is_dir() else start.parent, linted)
    return lr if lr is not None else project_root(path)

