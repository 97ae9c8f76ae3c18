"""Is the model sharded by FSDP at a given point of a timeline? (shared by FSDP108 and FSDP110)."""

from __future__ import annotations

from typing import Optional


def fsdp_state(a, t, ev) -> Optional[str]:
    """"fsdp1"/"fsdp2" when `ev`'s model is FSDP-wrapped at that point, including `accelerator.prepare` under an
    accelerate/Trainer FSDP launch; None otherwise."""
    if ev.entity is None:
        return None
    state = t.wrap_state(ev.entity, ev.seq, at=ev)
    if state is not None:
        return state
    launch = getattr(a, "launch", None)
    if launch is not None and launch.fsdp_version in (1, 2) and t.before(ev, ("prepare",)):
        return f"fsdp{launch.fsdp_version}"
    return None


def under_context(a, ev, *names: str) -> bool:
    """Whether the event runs inside `with <...>.name(...)` for one of `names`."""
    for w in a.enclosing_withs(ev.step):
        code = a.code(w)
        if any(n in code for n in names):
            return True
    return False
