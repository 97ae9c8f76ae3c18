"""What a rule's claim rests on, kept next to the rule: measured by a run, read at adjacent releases, or
cited only. `docs/facts.md` is generated from these and from the behaviour table (fsdplint/facts_page.py)."""

from __future__ import annotations

from dataclasses import dataclass

MEASURED, READ, CITED = "measured", "read", "cited"


@dataclass(frozen=True)
class Fact:
    claim: str
    versions: str  # where the claim holds, e.g. "torch 2.13.0" or "bitsandbytes >= 0.44.0"
    kind: str  # MEASURED, READ (at the two releases in `read_at`) or CITED
    evidence: str  # what the run printed, or what was read
    command: str = ""  # how to re-check it (a bench/facts script, or bench/facts/release_bisect.py)
    read_at: tuple[str, ...] = ()  # the two adjacent releases read: (last without, first with)
