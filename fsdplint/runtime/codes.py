"""Rule metadata for runtime findings, and ruff-style code selection."""

from __future__ import annotations

from fsdplint.findings import Finding, Position, Severity

RUNTIME_FILENAME = "<runtime>"

def rule_meta(code: str) -> tuple[str, Severity]:
    """Name and severity from the rule classes: one source of truth for every side."""
    from fsdplint.registry import rules_by_code

    rule = rules_by_code()[code]
    return rule.name, rule.severity


def make_finding(code: str, message: str, *, severity: Severity | None = None, **notes) -> Finding:
    name, default_severity = rule_meta(code)
    return Finding(
        code=code,
        name=name,
        severity=severity or default_severity,
        filename=RUNTIME_FILENAME,
        start=Position(1, 1),
        end=Position(1, 1),
        message=message,
        notes={k: str(v) for k, v in notes.items()},
    )


def _known_codes() -> dict[str, str]:
    """code -> name for every code a selector may refer to."""
    from fsdplint.registry import all_rules

    return {r.code: r.name for r in all_rules()}


def make_selector(select=None, ignore=None):
    """Return `code -> bool`. Patterns are codes, code prefixes (`FSDP1`), rule names or `ALL`."""
    known = _known_codes()

    def normalise(patterns, what):
        if isinstance(patterns, str):
            patterns = [patterns]
        out = []
        for raw in patterns or ():
            p = str(raw).strip()
            if not p:
                continue
            by_name = [c for c, n in known.items() if n == p.lower()]
            if by_name:
                out.extend(by_name)
                continue
            p = p.upper()
            if p != "ALL" and not any(c.startswith(p) for c in known):
                raise ValueError(f"fsdplint.check: unknown rule selector {raw!r} in {what}=")
            out.append(p)
        return out

    chosen = normalise(select, "select")
    dropped = normalise(ignore, "ignore")

    def matches(code, patterns):
        return any(p == "ALL" or code.startswith(p) for p in patterns)

    def selected(code: str) -> bool:
        if chosen and not matches(code, chosen):
            return False
        return not matches(code, dropped)

    return selected
