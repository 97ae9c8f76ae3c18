"""The YAML side of the rules: reporting on a training-tool job (fsdplint.launch.tools)."""

from __future__ import annotations

from typing import Optional

from fsdplint.findings import Severity


def job_of(ctx):
    """The axolotl / LLaMA-Factory job being linted, or None for a script."""
    options = getattr(ctx, "options", None) or {}
    return options.get("job")


def report_job(ctx, setting, message: str, gate=None, remedy: Optional[str] = None) -> None:
    """Report at a job's YAML line unless the tool handles it at this version; a finding that
    depends on a tool version nobody declared is a warning saying what to declare."""
    if setting is None or (gate is not None and gate.affected is False):
        return
    rule = ctx.rule
    unknown = gate is not None and gate.affected is None
    severity = Severity.WARNING if unknown and rule.severity is Severity.ERROR else None
    text = message.rstrip(".") + (gate.suffix() if gate is not None else "")
    text += "" if text.endswith("?") else "."
    if remedy:
        text += " " + remedy
    ctx.report_setting(setting, text, severity=severity)
