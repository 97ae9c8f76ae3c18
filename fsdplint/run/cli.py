"""`fsdplint run [OPTIONS] -- LAUNCH COMMAND` and `fsdplint run SCRIPT` (the launches the static side
found for it). This command EXECUTES the job's code; nothing else in fsdplint does."""

from __future__ import annotations

import os
import shlex
import sys

import click

from fsdplint.errors import FsdplintError

HELP = """Run the job's real launch in a dry-run world: a fake process group of N ranks, CUDA calls
answered as on an N-GPU node, each model a shrunk twin of its config.json (same modules, names, dtypes,
quantization; small sizes, random values, on the CPU; no weights), the real transformers / peft /
bitsandbytes / accelerate / FSDP code. The job's forward and backward run; it stops at its first
optimizer step (with --until save: runs on past it, its data loaders cut, to the job's first save,
written to a directory of the run's own and judged) and reports, in fsdplint's codes, what the cluster would raise and what the live model
shows, with the per-rank memory of the real config. WARNING: this EXECUTES the job's code (and everything it imports). The hub is offline
unless HF_HUB_OFFLINE is set in the environment.

    fsdplint run --world-size 64 -- torchrun --nproc_per_node 8 train.py --model_dir ./m

    fsdplint run train.py            (each launch the static side found for train.py)
"""


@click.command("run", help=HELP, context_settings={"ignore_unknown_options": True})
@click.option("--world-size", type=int, default=None, help="Ranks in the simulated job (default: the launch's nproc x nnodes).")
@click.option("--nnodes", type=int, default=None, help="Nodes (default: the launch's, else 1).")
@click.option("--gpu-memory", default="80GiB", show_default=True, help="Memory of each simulated GPU.")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Wall-clock limit per run, seconds.")
@click.option("--launch", "launches", multiple=True, help="A launch command to run (repeatable).")
@click.option("--until", default="step", show_default=True, type=click.Choice(("step", "save")),
              help="Where each rank stops: its first optimizer step, or (save) the job's first save after it.")
@click.option("--output-format", default="concise", type=click.Choice(("concise", "full", "json", "json-lines", "github", "sarif", "junit")))
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run_command(world_size, nnodes, gpu_memory, timeout, launches, until, output_format, command):
    try:
        code = _main(world_size, nnodes, gpu_memory, timeout, launches, output_format, list(command), until)
    except FsdplintError as e:
        click.echo(f"fsdplint: error: {e}", err=True)
        sys.exit(2)
    sys.exit(code)


def _commands(launches, command) -> list[tuple[list[str], str]]:
    """(words, working directory) of each launch to run; a launch found in a shell file runs from
    that file's directory, as its relative paths expect."""
    here = os.getcwd()
    out = [(shlex.split(c), here) for c in launches]
    if command and (len(command) > 1 or not command[0].endswith(".py")):
        out.append((command, here))
    elif command:  # `fsdplint run train.py`: the launches the static side found for it
        from pathlib import Path

        from fsdplint.launch.shell import launches_for

        script = Path(command[0])
        if not script.is_file():
            raise FsdplintError(f"{command[0]}: No such file")
        found = launches_for(script.resolve())
        for launch in found:
            out.append((_launch_words(launch), os.path.dirname(os.path.abspath(launch.path)) if launch.path else here))
        if not found:
            out.append((["python", command[0]], here))
    if not out:
        raise FsdplintError("fsdplint run: give a launch command after `--`, a script, or --launch")
    return out


def _launch_words(launch) -> list[str]:
    from fsdplint.run.command import launch_words

    return launch_words(launch)


def _main(world_size, nnodes, gpu_memory, timeout, launches, output_format, command, until="step") -> int:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise FsdplintError("`fsdplint run` needs the run extra: pip install 'fsdplint[run]'") from None
    from fsdplint.audit.spec import parse_size
    from fsdplint.output import write_report
    from fsdplint.run import command as cmd
    from fsdplint.run import report, runner

    try:
        memory = parse_size(gpu_memory, "--gpu-memory")
    except Exception as e:
        raise FsdplintError(str(e)) from None
    all_findings = []
    for words, cwd in _commands(launches, command):
        job = _in(cwd, cmd.parse, words)
        nodes = nnodes or job.nnodes or 1
        ws = world_size or (job.nproc_per_node or 1) * nodes
        local = max(ws // nodes, 1) if (world_size or nnodes) else (job.nproc_per_node or ws)
        result = runner.run(job, world_size=ws, local_world_size=local, gpu_memory=memory, timeout=timeout,
                            cwd=cwd, until=until)
        found = report.findings(result)
        all_findings.extend(found)
        # What each rank reached: with the findings on a terminal, or beside a machine-read report on stderr.
        report.write_summary(result, sys.stdout if output_format in ("concise", "full") else sys.stderr)
    write_report(all_findings, output_format, sys.stdout)
    # Exit codes as for `check` at its default --fail-level: an info (e.g. FSDP502, ranks whose shards hold no
    # trainable elements) is reported but does not fail the run.
    from fsdplint.findings import Severity

    return 1 if any(f.severity.rank <= Severity.WARNING.rank for f in all_findings) else 0


def _in(cwd: str, fn, *args):
    """Read the launch from its own directory (its script and config paths are relative to it)."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return fn(*args)
    finally:
        os.chdir(old)
