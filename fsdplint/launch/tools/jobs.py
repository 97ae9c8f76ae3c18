"""Linking a tool job to the accelerate config its launcher names."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from fsdplint.launch.tools.job import Job


def launch_for_job(job: Job, path: Path, root: Optional[str] = None) -> None:
    """A job without FSDP settings of its own takes them from the single FSDP accelerate config
    that a launcher names on the same command line as the job's YAML."""
    if job.launch is not None:
        return
    facts = launcher_config(path, root)
    if facts is not None:
        from fsdplint.launch.tools.llamafactory import use_launch

        use_launch(job, facts, f"launched with {facts.source}")


def launcher_config(path: Path, root: Optional[str] = None):
    """The FSDP LaunchFacts of the one accelerate config named with `path` by a `*.sh` launcher."""
    from fsdplint.errors import UsageError
    from fsdplint.launch.settings import load_accelerate_config
    from fsdplint.launch.tools.launchers import configs_for, search_root

    base = search_root(path, root)
    found = []
    for cfg in configs_for(path, base):
        try:
            facts = load_accelerate_config(cfg)
        except UsageError:
            continue  # reported when the YAML itself is linted
        if facts.uses_fsdp:
            found.append(facts)
    return found[0] if len(found) == 1 else None


def _scalar(v):
    """A launcher flag's text as HfArgumentParser would read it (ints, floats, booleans; else the text)."""
    if not isinstance(v, str):
        return v
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def jobs_launched_with(config: Path, facts, root: Optional[str], versions_for, *, explicit=None,
                       use_installed: bool = True, given=None) -> list:
    """LLaMA-Factory jobs given as launcher flags (`accelerate launch --config_file CONFIG src/train.py
    --stage sft --quantization_bit 4 ...`), each launched with this accelerate config. Values point at
    the launcher's lines. `versions_for(path)` resolves the library versions near the launcher. `given`:
    the commands of `--launch` (they replace the project's launchers; their values point at `--launch`,
    their versions are those of the config's project)."""
    from fsdplint.launch.settings import Setting
    from fsdplint.launch.tools.launchers import _display, lines_naming_config, search_root
    from fsdplint.launch.tools.llamafactory import looks_like, use_launch
    from fsdplint.launch.tools.read import job_from_values

    base = search_root(config, root)
    out = []
    for ll in lines_naming_config(config, base, given):
        if not ll.llamafactory_args:
            continue
        name = str(_display(ll.launcher)) if given is None else str(ll.launcher)
        values = {k: Setting(k, _scalar(v), name, row) for k, v, row in ll.llamafactory_args}
        if not looks_like(set(values) | {"model_name_or_path"}) or "model_name_or_path" not in values:
            continue  # a generic train.py with other flags
        if given is None:
            try:
                text = ll.launcher.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            near = ll.launcher
        else:
            text = next((l.text for l in given if l.line == ll.line and l.file == str(ll.launcher)), "")
            near = config  # a typed command belongs to no file: the versions are the config's project's
        job = job_from_values("llamafactory", name, text, values, path=near, explicit=explicit,
                              use_installed=use_installed, versions=versions_for(near))
        use_launch(job, facts, f"launched with {facts.source}")
        out.append(job)
    return out
