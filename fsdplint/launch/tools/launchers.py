"""Which accelerate config (and which tool YAML or script) a project's launchers name.

Read with the shell reader (`fsdplint.launch.shell`): every `accelerate launch --config_file PATH ...` of the
project's shell scripts and documented commands, with the files its script and arguments name and, for a
LLaMA-Factory entry point, its `--key value` flags. Paths are resolved from where the launch runs (its
`cd`, the launcher's directory, then the project root).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional

from fsdplint.launch.shell import Launch, launched_files, read_launches, script_options, shell_files, working_dirs

_MAX_DEPTH = 6


@dataclass(frozen=True)
class LaunchLine:
    launcher: Path
    line: int  # 1-based line of the command in the launcher
    config: Path  # the accelerate config
    named: tuple = field(default_factory=tuple)  # other files on the command line (resolved)
    # (key, value, row) flags of a LLaMA-Factory entry point on the same command line.
    llamafactory_args: tuple = field(default_factory=tuple)


def _resolve(token: str, dirs: list[Path]) -> Optional[Path]:
    for base in dirs:
        p = (base / token) if not os.path.isabs(token) else Path(token)
        try:
            if p.is_file():
                return Path(os.path.normpath(p))
        except OSError:
            continue
    return None


def _is_llamafactory_entry(launch: Launch) -> bool:
    """LLaMA-Factory entry points whose `--key value` flags are its HfArgumentParser arguments."""
    if launch.module:
        return launch.module.split(".")[0] in ("llamafactory", "llmtuner")
    script = (launch.script or "").replace("\\", "/")
    return script.endswith(("train_bash.py", "src/train.py"))


def _line_of(sh: Path, launch: Launch, root: Path) -> Optional[LaunchLine]:
    cfg_word = launch.options.get("config_file")
    if launch.launcher != "accelerate" or cfg_word is None or cfg_word.unknown:
        return None  # `--config_file` of some other program, or one the reader cannot know
    # A command given on the command line runs where fsdplint runs (then the project root).
    dirs = working_dirs(launch, root) if launch.path else [Path.cwd().resolve(), root]
    cfg = _resolve(cfg_word.text, dirs)
    if cfg is None or cfg.suffix not in (".yaml", ".yml"):
        return None
    named = list(launched_files(launch, root))
    for w in launch.args:
        if not w.unknown and w.text.endswith((".yaml", ".yml", ".py")) and not w.text.startswith("-"):
            found = _resolve(w.text.split("=", 1)[-1], dirs)
            if found is not None:
                named.append(found)
    lf = ()
    if _is_llamafactory_entry(launch):
        lf = tuple((name, True if value is None else value.text, line)
                   for name, value, line in script_options(launch.args) if value is None or not value.unknown)
    return LaunchLine(sh, launch.line, cfg, tuple(dict.fromkeys(named)), lf)


@lru_cache(maxsize=64)
def launch_lines(root: Path) -> tuple[LaunchLine, ...]:
    out = []
    for sh in shell_files(root, _MAX_DEPTH):
        try:
            text = sh.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "config_file" not in text and "config-file" not in text:
            continue
        for launch in read_launches(sh, str(sh)):
            got = _line_of(sh, launch, root)
            if got is not None:
                out.append(got)
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


def lines_naming_config(config: Path, project_root: Path, given=None) -> list[LaunchLine]:
    """The launcher command lines that pass `config` with --config_file: the project's, or with `given` (the
    commands of `--launch`, which replace the project's launchers) those commands."""
    target = Path(os.path.normpath(Path(config).resolve()))
    root = Path(os.path.normpath(Path(project_root).resolve()))
    if given is not None:
        lines = [ll for ll in (_line_of(Path(l.file), l, root) for l in given) if ll is not None]
    else:
        lines = launch_lines(root)
    return [ll for ll in lines if Path(os.path.normpath(ll.config.resolve())) == target]


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

