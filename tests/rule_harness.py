"""Runs a rule's VALID/INVALID examples through the real engine (as `fsdplint` would)."""

from __future__ import annotations

from fsdplint.engine import FileConfig, Settings, fix_text, lint_text
from fsdplint.rule import Rule, Valid


def settings_for(rule: type[Rule], example: Valid, fix: str | None = None) -> Settings:
    options = dict(example.options)
    if "accelerate_config" in options:
        from fsdplint.launch.settings import parse_accelerate_config

        options["launch"] = parse_accelerate_config(options.pop("accelerate_config"), "accelerate_config.yaml")
    if "launch_command" in options:
        # A command that runs the example (its arguments bind to the script's parsers), as `--launch` gives.
        from fsdplint.launch.shell import launches_from_command

        options["launches"] = launches_from_command(options.pop("launch_command"))
    if "tool_config" in options:
        # An axolotl / LLaMA-Factory YAML job: the rules see it as the engine's YAML lint does.
        import textwrap

        from fsdplint.launch.tools.read import read_job

        job = read_job(textwrap.dedent(options.pop("tool_config")).lstrip("\n"), "job.yml",
                       explicit=dict(example.target), use_installed=False)
        assert job is not None, "the example's tool_config is no axolotl / LLaMA-Factory config"
        options.update(job=job, launch=job.launch, discover_launch=False)
    return Settings(
        select=[rule.code],
        targets=dict(example.target),
        isolated=True,
        fix=fix,
        options=options,
        # Examples state their versions; the environment's installed torch must not leak in.
        use_installed=False,
        prefilter=False,
    )


def lint_example(rule: type[Rule], example: Valid):
    s = settings_for(rule, example)
    return lint_text(example.source(), "example.py", s, None, FileConfig(s, None))


def fix_example(rule: type[Rule], example: Valid) -> tuple[str, int]:
    s = settings_for(rule, example, fix="unsafe")
    text, applied, _, err = fix_text(example.source(), "example.py", s, None, FileConfig(s, None))
    assert err is None, err
    return text, applied
