"""What the values tests count as a finding the inputs decide.

The values tests probe with FSDP201 (a 4-bit model sharded by `fully_shard`): their subject is whether a
value reaches the rule, not the rule's severity. FSDP201 is a warning rule (bench/facts/fsdp201_cpu_check.py:
on CPU with bitsandbytes >= 0.44 the sharded model still computes), so a decided FSDP201 is told from one
that only an opt-in flag left free could give by its message: the latter names the flag ("with `--x`").
"""

from __future__ import annotations


def opt_in(f: dict) -> bool:
    """A finding that holds only when an opt-in flag the launch leaves off is switched on."""
    return "with `--" in f["message"]


def decided(f: dict) -> bool:
    """An error, or an FSDP201 that the launch and the parsed values decide."""
    if f["severity"] == "error":
        return True
    return f["code"] == "FSDP201" and f["severity"] == "warning" and not opt_in(f)


def label(f: dict) -> str:
    """The severity, with FSDP201's decided/opt-in warnings told apart ("decided" / "opt-in")."""
    if f["code"] == "FSDP201" and f["severity"] == "warning":
        return "opt-in" if opt_in(f) else "decided"
    return f["severity"]
