"""What a rule's `audit(ctx)` method sees, and how it reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from fsdplint.findings import Finding, Position


@dataclass
class AuditContext:
    spec: Any  # AuditSpec
    built: Any  # Built
    params: list  # list[ParamInfo]
    plan: Any  # Plan
    memory: Any  # MemoryEstimate
    torch_version: str  # target torch (spec or installed)
    torch_version_source: str
    selected: Optional[set] = None
    findings: list[Finding] = field(default_factory=list)

    # -- helpers for rules -------------------------------------------------
    @property
    def fsdp(self):
        return self.spec.fsdp

    def torch_at_least(self, version: str) -> bool:
        from packaging.version import Version

        return Version(self.torch_version) >= Version(version)

    def problems(self, code: str):
        """peft/torch errors (build or plan) attributed to `code`."""
        out = [(p.message, None, p.field) for p in self.built.problems if p.code == code]
        out += [(p.message, p.unit, None) for p in self.plan.problems if p.code == code]
        return out

    def grouped_problems(self, code: str):
        """Problems of `code` whose messages differ only by unit name, grouped:
        (first message, [units], field)."""
        groups: dict[str, list] = {}
        for message, unit, fieldpath in self.problems(code):
            key = message.replace(unit, "{unit}") if unit else message
            groups.setdefault(key, []).append((message, unit, fieldpath))
        return [(items[0][0], [u for _, u, _ in items], items[0][2]) for items in groups.values()]

    def grouped_plan_problems(self, code: str):
        """The plan's problems of `code` grouped as `grouped_problems` does: (first PlanProblem, [units])."""
        groups: dict = {}
        for p in self.plan.problems:
            if p.code != code:
                continue
            key = (p.message.replace(p.unit, "{unit}") if p.unit else p.message, p.cause, p.after)
            groups.setdefault(key, []).append(p)
        return [(items[0], [q.unit for q in items]) for items in groups.values()]

    @staticmethod
    def raised(problem, who: str = "FSDP1") -> str:
        """'FSDP1 would raise' or, past earlier failures, 'With FSDP004 fixed, FSDP1 would next raise'."""
        if problem.after:
            names = [c if c != problem.code else f"the {c} above" for c in dict.fromkeys(problem.after)]
            return f"With {' and '.join(names)} fixed, {who} would next raise"
        return f"{who} would raise"

    @staticmethod
    def more_units(units) -> str:
        """' The same holds for N more units (a, b, ...).' for units after the first."""
        rest = [u or "(root)" for u in units[1:]]
        if not rest:
            return ""
        shown = ", ".join(rest[:3]) + (", ..." if len(rest) > 3 else "")
        return f" The same holds for {len(rest)} more unit{'s' if len(rest) > 1 else ''} ({shown})."

    def report_problems(self, rule) -> None:
        for message, unit, fieldpath in self.problems(rule.code):
            self.report(rule, message, unit=unit, field=fieldpath)

    # -- reporting ---------------------------------------------------------
    def report(self, rule, message: str, *, unit: Optional[str] = None, param: Optional[str] = None,
               field: Optional[str] = None) -> None:
        """Add a finding. `rule` is a Rule class/instance or a code; `field` is a spec key
        such as "lora.target_modules" used to point at its line."""
        from fsdplint.registry import get_rule

        r = get_rule(rule) if isinstance(rule, str) else rule
        if self.selected is not None and r.code not in self.selected:
            return
        row, col = self.spec.position_of(field)
        notes = {}
        if unit is not None:
            notes["unit"] = unit or "(root)"
        if param is not None:
            notes["param"] = param
        if field:
            notes["field"] = field
        f = Finding(code=r.code, name=r.name, severity=r.severity, filename=self.spec.filename,
                    start=Position(row, col), end=Position(row, col), message=message, notes=notes)
        if not any(g.code == f.code and g.message == f.message for g in self.findings):
            self.findings.append(f)
