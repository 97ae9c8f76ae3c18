"""Is the model sharded by FSDP at a given point of a timeline? (shared by FSDP108, FSDP110, FSDP401, FSDP402)."""

from __future__ import annotations

import re
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
    """Whether the event runs inside `with <...>.name(...)` for one of `names`, also through a name bound to
    such a context or a lambda returning one (`ctx = lambda: FSDP.summon_full_params(m) if fsdp else
    nullcontext()`, then `with ctx():`)."""
    import libcst as cst

    from fsdplint.resolve import dotted

    scope = ev.call.scope if ev.call is not None else None
    for w in a.enclosing_withs(ev.step):
        code = a.code(w)
        if any(n in code for n in names):
            return True
        target = w.func if isinstance(w, cst.Call) else w
        d = dotted(target) if isinstance(target, (cst.Name, cst.Attribute)) else None
        bound = a.binding(d, scope) if d else None
        if bound is not None and any(n in a.code(bound) for n in names):
            return True
    return False


# Objects whose `save_pretrained` writes a small file and gathers nothing: configs, tokenizers, processors.
_NOT_MODEL = re.compile(r"(?i)(config|tokenizer|processor|feature_extractor|image_processor|generation_config)$")


def saves_no_weights(a, ev) -> bool:
    """`model.config.save_pretrained(...)`, `tokenizer.save_pretrained(...)`: a save of an object that is not
    the model's weights (no collective, no shard)."""
    call = ev.call
    if call is None or call.receiver is None:
        return False
    recv = a.code(call.receiver)
    return bool(_NOT_MODEL.search(recv.split("(")[0].rsplit(".", 1)[-1]))
