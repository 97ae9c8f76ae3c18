"""What a lint rests on, per file (`fsdplint check -v` / `--show-settings`): the project root, each launch
used and where it was found, the launch configs read, and each library version with its source.

It asks the same functions the lint asks (the launch search, the config lookups, the version resolver), so
what it prints is what the findings were computed from, not a second opinion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

# The libraries whose releases the rules depend on.
LIBRARIES = ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "trl")


def _root(path: Path, linted: Optional[str]) -> str:
    from fsdplint.roots import find_root, linted_root

    root = find_root(path)
    if root is not None:
        return f"{root} (nearest directory with pyproject.toml, setup.cfg, setup.py or .git)"
    lr = linted_root(path.resolve().parent, linted)
    if lr is not None:
        return f"{lr} (the linted directory; no project marker above the file)"
    return f"{path.resolve().parent} (the file's directory; no project marker above it)"


def _configs(path: Path, runs, options) -> list[str]:
    from fsdplint.launch import settings as launch_mod
    from fsdplint.launch.runs import base_dirs

    out: list[str] = []
    given = options.get("launch")
    if given is not None and given.source:
        out.append(f"{given.source} (--accelerate-config)")
    # As the lint does: a launch's own config first; with none (no launch, or `accelerate launch` without
    # --config_file), the single FSDP config next to the script or one a launcher names with it.
    open_ = not runs
    for run in runs:
        facts = launch_mod.from_launcher(run.launch, base_dirs(run, path))
        if facts is not None and facts.source:
            how = ("the user's default accelerate config, read by this bare `accelerate launch`"
                   if facts.source == str(launch_mod.default_accelerate_config_path()) else "named by the launch")
            out.append(f"{facts.source} ({how} at {run.launch.label})")
        elif run.launch.launcher == "accelerate":
            open_ = True
    if open_ and options.get("discover_launch", True):
        facts = launch_mod.find_accelerate_config(path)
        if facts is not None and facts.source:
            out.append(f"{facts.source} (the one FSDP accelerate config next to the script)")
        else:
            from fsdplint.launch.tools.jobs import launcher_config

            facts = launcher_config(path, options.get("project_root"))
            if facts is not None and facts.source:
                out.append(f"{facts.source} (named with this script by a launcher's --config_file)")
    return list(dict.fromkeys(out))


def explain_file(filename: str, settings) -> list[str]:
    """The lines `-v` prints for one linted file."""
    from fsdplint.engine import FileConfig
    from fsdplint.launch.runs import runs_for
    from fsdplint.versions import resolve

    path = Path(filename) if filename != "-" else None
    lines = [f"{filename}:"]
    if path is None:
        lines.append("  (read from stdin: no project, launches or configs are looked up)")
        return lines
    options = settings.options
    fcfg = FileConfig(settings, path)
    lines.append(f"  project root: {_root(path, options.get('project_root'))}")
    if fcfg.config.source is not None:
        lines.append(f"  configuration: {fcfg.config.source}")
    runs = runs_for(path, filename, options) if path.suffix in (".py", ".pyi") else []
    if runs:
        lines.append("  launches:")
        for run in runs:
            l = run.launch
            where = "given with --launch" if l.file == "--launch" else (
                "the launcher named on the command line" if l in options.get("launcher_launches", ())
                else "found in the project's shell scripts")
            what = f"-m {l.module}" if l.module else l.script
            lines.append(f"    {l.label}: {l.launcher} {what} ({where})")
    else:
        candidates = []
        if path.suffix in (".py", ".pyi"):
            from fsdplint.launch.arguments import might_parse_arguments
            from fsdplint.launch.runs import candidate_runs

            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                text = ""
            if might_parse_arguments(text):
                candidates = candidate_runs(path, text, options, settings.use_installed)
        if candidates:
            lines.append("  launches: none named; candidates inferred from lone recipes that fit the script's "
                         "arguments (their findings are warnings):")
            lines.extend(f"    {r.launch.file} (linted under the script's defaults too)" for r in candidates)
        else:
            lines.append("  launches: none (linted under the script's defaults)")
    configs = _configs(path, runs, options)
    lines.append("  launch configs read: " + (", ".join(configs) if configs else "none"))
    lines.append("  library versions:")
    stop = options.get("project_root")
    source = str(fcfg.config.source.name) if fcfg.config.source else "[tool.fsdplint]"
    for lib in LIBRARIES:
        tv = resolve(lib, path, settings.targets, fcfg.config.target_version, source, settings.use_installed, stop=stop)
        lines.append(f"    {tv.describe()}")
    return lines
