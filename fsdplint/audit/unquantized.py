"""What a bitsandbytes load leaves unquantized, said in the report: bnb replaces `nn.Linear` layers only
(and skips `lm_head` and the modules `llm_int8_skip_modules` names), so fused 3-D MoE expert tensors,
embeddings and norms keep the model dtype, and for a MoE model that can be most of its weights."""

from __future__ import annotations

from typing import Optional


def _group(p) -> str:
    if p.expert:
        return "MoE expert parameters (fused 3-D tensors, not nn.Linear: bnb does not quantize them)"
    classes = [cls for _name, cls in p.owners]
    if any(c == "Embedding" for c in classes) or "lm_head" in p.fqn or "embed" in p.fqn:
        return "embeddings and lm_head"
    if any("norm" in c.lower() for c in classes) or "norm" in p.fqn.lower():
        return "norms"
    return next((f"{c} parameters" for c in classes), "other parameters")


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def unquantized_note(params: list) -> Optional[str]:
    """A note when some weights are quantized: how many frozen parameters stay in the model dtype, by kind."""
    if not any(p.kind in ("4bit", "8bit") for p in params):
        return None
    quantized = sum(p.numel for p in params if p.kind in ("4bit", "8bit"))
    kept: dict[str, int] = {}
    for p in params:
        if p.kind or p.requires_grad:
            continue
        g = _group(p)
        kept[g] = kept.get(g, 0) + p.numel
    total = quantized + sum(kept.values())
    if not kept or total == 0:
        return None
    parts = ", ".join(f"{_count(n)} in {g}" for g, n in sorted(kept.items(), key=lambda kv: -kv[1]))
    share = 100 * sum(kept.values()) / total
    return (f"unquantized: {_count(sum(kept.values()))} of the {_count(total)} frozen base parameters "
            f"({share:.0f}%) stay in the model dtype: {parts}.")
