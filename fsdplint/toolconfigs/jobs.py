"""Linking a tool job to the accelerate config its launcher names."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from fsdplint.toolconfigs.job import Job


def launch_for_job(job: Job, path: Path, root: Optional[str] = None) -> None:
    """A job without FSDP settings of its own takes them from the single FSDP accelerate config
    that a launcher names on the same command line as the job's YAML."""
    if job.launch is not None:
        return
    facts = launcher_config(path, root)
    if facts is not None:
        from fsdplint.toolconfigs.llamafactory import use_launch

        use_launch(job, facts, f"launched with {facts.source}")


def launcher_config(path: Path, root: Optional[str] = None):
    """The FSDP LaunchFacts of the one accelerate config named with `path` by a `*.sh` launcher."""
    from fsdplint.errors import UsageError
    from fsdplint.launch import load_accelerate_config
    from fsdplint.toolconfigs.launchers import configs_for, project_root

    base = Path(root) if root else project_root(path)
    found = []
    for cfg in configs_for(path, base):
        try:
            facts = load_accelerate_config(cfg)
        except UsageError:
            continue  # reported when the YAML itself is linted
        if facts.uses_fsdp:
            found.append(facts)
    return found[0] if len(found) == 1 else None
