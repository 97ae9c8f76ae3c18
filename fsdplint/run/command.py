"""The launch command, read by the launchers' own argument parsers: what each rank would run.

`torchrun` (and `python -m torch.distributed.run`) is parsed by torch's `get_args_parser`;
`accelerate launch` by accelerate's `launch_command_parser` and `_validate_launch_command` (which read
its `--config_file` and defaults), and its `prepare_multi_gpu_env` gives the environment accelerate
hands the script (ACCELERATE_USE_FSDP, FSDP_*, mixed precision ...). `python [-m] ...` runs as is;
`bash run.sh ARGS` (or `./run.sh`, `sh`, `bash -c "..."`) runs the launch the shell file holds, read by
the static side's shell reader (variables, continuations, `"$@"` given ARGS); any other first word is a
console script (`trl`, `axolotl`, `llamafactory-cli`) found through its installed entry point.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Optional

from fsdplint.errors import UsageError


@dataclass
class Job:
    kind: str  # "path" | "module" | "console"
    entry: str  # script path, module name, or "module:function"
    argv0: str
    args: list[str]
    nproc_per_node: Optional[int] = None
    nnodes: Optional[int] = None
    env: dict = field(default_factory=dict)
    launcher: str = "python"
    text: str = ""


_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def parse(words: list[str]) -> Job:
    if not words:
        raise UsageError("fsdplint run: no launch command after `--`")
    env: dict[str, str] = {}
    words = list(words)
    while words and (words[0] == "env" or _ASSIGN.match(words[0])):
        w = words.pop(0)
        if w != "env":
            k, _, v = w.partition("=")
            env[k] = v
    if not words:
        raise UsageError("fsdplint run: the launch command sets variables but runs nothing")
    head = os.path.basename(words[0])
    rest = words[1:]
    if re.fullmatch(r"python(\d+(\.\d+)*)?", head):
        job = _python(rest)
    elif head == "torchrun":
        job = _torchrun(rest)
    elif head == "accelerate" and rest[:1] == ["launch"]:
        job = _accelerate(rest[1:])
    elif head in _SHELLS or (head.endswith(".sh") and os.path.isfile(words[0])):
        inner = _shell(rest) if head in _SHELLS else _shell_file(words[0], rest)
        inner.env = {**env, **inner.env}
        return inner
    else:
        job = _console(words[0], rest)
    job.env = {**env, **job.env}
    job.text = " ".join(words)
    return job


def _python(rest: list[str]) -> Job:
    i = 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] != "-m":
        i += 2 if rest[i] in ("-W", "-X") else 1
    if i < len(rest) and rest[i] == "-m":
        if i + 1 >= len(rest):
            raise UsageError("fsdplint run: `python -m` names no module")
        module, args = rest[i + 1], rest[i + 2:]
        if module in ("torch.distributed.run", "torch.distributed.launch"):
            return _torchrun(args)
        if module == "accelerate.commands.launch":
            return _accelerate(args)
        return Job("module", module, module, args)
    if i >= len(rest):
        raise UsageError("fsdplint run: `python` runs no script")
    return _script(rest[i], rest[i + 1:])


def _script(path: str, args: list[str], **kw) -> Job:
    if not os.path.isfile(path):
        raise UsageError(f"fsdplint run: {path}: No such file")
    return Job("path", os.path.abspath(path), path, list(args), **kw)


def _int(text) -> Optional[int]:
    try:
        return int(str(text).split(":")[-1])
    except (TypeError, ValueError):
        return None


def _torchrun(rest: list[str]) -> Job:
    from torch.distributed.run import get_args_parser

    try:
        a = get_args_parser().parse_args(rest)
    except SystemExit:
        raise UsageError(f"fsdplint run: torchrun rejects its arguments: {' '.join(rest)}") from None
    kw = dict(nproc_per_node=_int(a.nproc_per_node), nnodes=_int(a.nnodes), launcher="torchrun")
    if a.module:
        return Job("module", a.training_script, a.training_script, list(a.training_script_args), **kw)
    return _script(a.training_script, a.training_script_args, **kw)


def _accelerate(rest: list[str]) -> Job:
    try:
        from accelerate.commands.launch import _validate_launch_command, launch_command_parser
        from accelerate.utils.launch import prepare_multi_gpu_env
    except ImportError:
        raise UsageError("fsdplint run: `accelerate launch` needs accelerate: pip install 'fsdplint[run]'") from None
    try:
        args = launch_command_parser().parse_args(rest)
    except SystemExit:
        raise UsageError(f"fsdplint run: accelerate launch rejects its arguments: {' '.join(rest)}") from None
    if args.config_file and not os.path.isfile(args.config_file):
        raise UsageError(f"fsdplint run: {args.config_file}: No such file (accelerate --config_file)")
    try:
        args, _, _ = _validate_launch_command(args)
    except (ValueError, TypeError, KeyError) as e:
        raise UsageError(f"fsdplint run: accelerate launch: {e}") from None
    env = {}
    if getattr(args, "use_fsdp", False) or getattr(args, "multi_gpu", False) or (args.num_processes or 1) > 1:
        args.multi_gpu = True
        full = prepare_multi_gpu_env(args)
        env = {k: v for k, v in full.items() if k.startswith(("ACCELERATE_", "FSDP_")) or k in ("PYTHONPATH",)
               and v != os.environ.get(k)}
    nproc = (args.num_processes or 1) // max(args.num_machines or 1, 1)
    kw = dict(nproc_per_node=nproc, nnodes=args.num_machines or 1, env=env, launcher="accelerate")
    if args.module:
        return Job("module", args.training_script, args.training_script, list(args.training_script_args), **kw)
    return _script(args.training_script, args.training_script_args, **kw)


def _console(name: str, rest: list[str]) -> Job:
    from importlib.metadata import entry_points

    base = os.path.basename(name)
    found = [e for e in entry_points(group="console_scripts") if e.name == base]
    if not found:
        hint = f" ({shutil.which(base)} is not a Python console script)" if shutil.which(base) else \
            f": pip install it ({_PACKAGES.get(base, base)})"
        raise UsageError(f"fsdplint run: {base} is not installed{hint}")
    return Job("console", found[0].value, base, list(rest), launcher=base)


_PACKAGES = {"trl": "pip install 'fsdplint[run]'", "axolotl": "pip install axolotl",
             "llamafactory-cli": "pip install llamafactory"}


_SHELLS = {"bash", "sh", "dash", "zsh"}
_RUNNABLE = ("python", "torchrun", "accelerate")


def _shell(rest: list[str]) -> Job:
    """`bash [-xe] FILE ARGS` or `bash -c "COMMAND"`."""
    i = 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] != "-c":
        i += 1
    if i < len(rest) and rest[i] == "-c":
        if i + 1 >= len(rest):
            raise UsageError("fsdplint run: `bash -c` gives no command")
        return _from_shell_text(rest[i + 1], "bash -c", None, rest[i + 2:])
    if i >= len(rest):
        raise UsageError("fsdplint run: the shell runs no file")
    return _shell_file(rest[i], rest[i + 1:])


def _shell_file(path: str, args: list[str]) -> Job:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise UsageError(f"fsdplint run: {path}: {e.strerror or e}") from None
    return _from_shell_text(text, path, os.path.abspath(path), args)


def _from_shell_text(text: str, name: str, path: Optional[str], args: list[str]) -> Job:
    from fsdplint.launch.shell import parse_launches

    found = [l for l in parse_launches(text, name, path) if l.launcher in _RUNNABLE]
    if not found:
        raise UsageError(f"fsdplint run: {name}: holds no python, torchrun or accelerate launch to run")
    # A launcher file runs its launches in order and the first one to reach FSDP is what fails first;
    # the dry run takes the first (the report names it).
    launch = found[0]
    job = parse(launch_words(launch, args))
    job.text = f"{launch.label}: {job.text}"
    return job


def launch_words(launch, splat_args: Optional[list[str]] = None) -> list[str]:
    """The command a launch the static side read would run, rebuilt from its parts. `"$@"` becomes
    `splat_args` (the arguments the shell file was given); another word the shell text leaves unknown
    (`$(...)`, an unset variable) is dropped, and the run says which launch it ran."""
    words = [f"{k}={w.text}" for k, w in launch.env.items() if not w.unknown]
    head = {"python": ["python"], "torchrun": ["torchrun"], "accelerate": ["accelerate", "launch"]}.get(launch.launcher)
    if head is None:
        raise UsageError(f"{launch.label}: `fsdplint run` does not run {launch.launcher} launches")
    words += head
    for name, w in launch.options.items():
        if name in ("m", "module") or w.unknown:
            continue
        words += [f"--{name}"] if w.text == "true" else [f"--{name}", w.text]
    if launch.module:
        words += ["-m", launch.module]
    elif launch.script:
        words.append(launch.script)
    for a in launch.args:
        if a.splat:
            words += list(splat_args or [])
        elif not a.unknown:
            words.append(a.text)
    return words
