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


def unwrapped_receiver(a, expr, scope, _depth: int = 0) -> bool:
    """`accelerator.unwrap_model(m)` or `m.module` (also through a name bound to one): the module inside the
    root FSDP1 unit. accelerate 1.15 `extract_model_from_parallel` strips an FSDP wrapper with `model.module`,
    so both read the root's parameters as its inner module holds them (flat-parameter shards), not through
    the root's state-dict hooks."""
    import libcst as cst

    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "unwrap_model":
        return bool(expr.args) and "accelerator" in a.code(expr.func.value).lower()
    if isinstance(expr, cst.Attribute) and expr.attr.value == "module":
        return True
    if isinstance(expr, cst.Name) and _depth < 3:
        bound = a.binding(expr.value, scope)
        return bound is not None and unwrapped_receiver(a, bound, scope, _depth + 1)
    return False


# Launch settings that give accelerate's FSDP1 plugin an auto-wrap policy (accelerate 1.15 utils/dataclasses.py:
# without them `auto_wrap_policy` is "NO_WRAP": the whole model is one unit).
_POLICY_KEYS = ("auto_wrap_policy", "transformer_layer_cls_to_wrap", "transformer_cls_names_to_wrap", "min_num_params")


def fsdp1_one_unit(a, t, ev) -> Optional[bool]:
    """Is the FSDP1 root of `ev`'s model its only unit (no auto-wrap policy)? True/False when the code or the
    launch says so, None when it cannot be told (or the model is not FSDP1)."""
    state = t.wrap_state(ev.entity, ev.seq, at=ev) if ev.entity else None
    if state == "fsdp1":
        wraps = [w for w in t.before(ev, ("wrap1",)) if w.ref is not None and not w.ref.child]
        if not wraps or any(w.call is None or w.call.star_kwargs() for w in wraps):
            return None
        return not any(a.keyword(w.call, "auto_wrap_policy") is not None for w in wraps)
    facts = getattr(a, "launch", None)
    if state is not None or facts is None or facts.fsdp_version != 1 or not t.before(ev, ("prepare",)):
        return None
    if facts.get("sharding") is not None:
        return None  # the Trainer's `--fsdp` options: not accelerate's plugin defaults
    for key in _POLICY_KEYS:
        s = facts.get(key)
        if s is not None:
            return str(s.value).strip().upper() == "NO_WRAP" if s.value is not None else None
    return True  # accelerate's default NO_WRAP
