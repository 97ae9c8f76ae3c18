"""The rule base class. One rule = one class in one file under `rules/`.

A rule declares its metadata and examples as class attributes (as Fixit does);
`tests/test_rule_examples.py` turns every VALID/INVALID example into a test.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Optional, Sequence, Union

from fsdplint.findings import Applicability, Severity

if TYPE_CHECKING:  # pragma: no cover
    from fsdplint.context import LintContext

DOC_SECTIONS = (
    "What it does",
    "Why is this bad?",
    "Example",
    "Use instead",
    "Fix safety",
    "Versions",
    "References",
)


@dataclass(frozen=True)
class Valid:
    """Code on which the rule must stay silent."""

    code: str
    # Target library versions for this example, e.g. {"torch": "2.6"}.
    target: Mapping[str, str] = field(default_factory=dict)
    # Extra lint inputs, e.g. {"accelerate_config": "<yaml text>"}.
    options: Mapping[str, Any] = field(default_factory=dict)

    def source(self) -> str:
        return textwrap.dedent(self.code).lstrip("\n")


@dataclass(frozen=True)
class Invalid(Valid):
    """Code on which the rule must fire (at `line`, 1-based, when given)."""

    line: Optional[int] = None
    # The whole file after applying this rule's fixes (safe and unsafe), if it has one.
    expected_fix: Optional[str] = None
    # The severity the finding has here, when not the rule's own (e.g. "warning" on an unknown version).
    severity: Optional[str] = None

    def fixed_source(self) -> Optional[str]:
        if self.expected_fix is None:
            return None
        return textwrap.dedent(self.expected_fix).lstrip("\n")


Example = Union[Valid, str]

# Options for an example that is one file of a job which runs under FSDP elsewhere (another file wraps the
# model, or the launcher enables it): rules that need FSDP in the job (`Rule.needs_fsdp`) then apply.
IN_FSDP_JOB: Mapping[str, Any] = {"fsdp_in_job": True}


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]
    summary: ClassVar[str]
    # "S" static script, "A" model audit, "R" runtime guard; any combination.
    sides: ClassVar[str] = "S"
    # The applicability of the fix this rule can offer, if any.
    fix: ClassVar[Optional[Applicability]] = None
    # Where the bug exists, as PEP 440 specifiers per distribution, e.g. {"torch": "<2.7"}.
    versions: ClassVar[Mapping[str, str]] = {}
    # What the rule's claims rest on (fsdplint.facts.Fact): rendered in docs/facts.md.
    facts: ClassVar[tuple] = ()
    # The rule's bug needs FSDP in the job: a file without any FSDP (and no launch config that enables
    # it) gets none of its findings. False for rules about something else (DDP, the file itself).
    needs_fsdp: ClassVar[bool] = True
    doc: ClassVar[str] = ""
    references: ClassVar[Sequence[str]] = ()

    VALID: ClassVar[Sequence[Example]] = ()
    INVALID: ClassVar[Sequence[Invalid]] = ()
    # Model-audit examples: audit specs (dicts) run on the meta device by the test suite.
    AUDIT_VALID: ClassVar[Sequence[Mapping[str, Any]]] = ()
    AUDIT_INVALID: ClassVar[Sequence[Mapping[str, Any]]] = ()

    def check(self, ctx: "LintContext") -> None:
        """Static side: inspect `ctx.analysis` / `ctx.module` and call `ctx.report(...)`."""

    def audit(self, ctx: Any) -> None:
        """Model side: inspect the built model and planned units and report."""

    @classmethod
    def valid_examples(cls) -> list[Valid]:
        return [v if isinstance(v, Valid) else Valid(v) for v in cls.VALID]

    @classmethod
    def has_static_check(cls) -> bool:
        return cls.check is not Rule.check

    @classmethod
    def has_audit(cls) -> bool:
        return cls.audit is not Rule.audit

    @classmethod
    def full_doc(cls) -> str:
        head = f"# {cls.code} {cls.name}\n\n{cls.summary}\n\n"
        meta = (
            f"- Severity: {cls.severity.value}\n"
            f"- Side: {', '.join(SIDE_NAMES[s] for s in cls.sides)}\n"
            f"- Fix: {cls.fix.value if cls.fix else 'none'}\n"
        )
        if cls.versions:
            meta += "- Affected versions: " + ", ".join(f"{k} {v}" for k, v in cls.versions.items()) + "\n"
        return head + meta + "\n" + textwrap.dedent(cls.doc).strip() + "\n"


SIDE_NAMES = {"S": "static", "A": "audit", "R": "runtime"}
