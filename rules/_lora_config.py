"""Small readers of `LoraConfig(...)` arguments shared by the LoRA rules."""

from __future__ import annotations

from typing import Any

from fsdplint.analysis import UNKNOWN


def target_parameters(a, call) -> bool:
    """True when the config targets parameters (a non-empty `target_parameters`, or one we cannot read)."""
    expr = a.keyword(call, "target_parameters")
    if expr is None or expr is UNKNOWN:
        return False
    v: Any = a.value(expr, call.scope)
    if v is UNKNOWN:
        return True  # a list built elsewhere: still targets parameters
    return bool(v)
