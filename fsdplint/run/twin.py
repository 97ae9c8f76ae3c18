"""The shrunk twin: the model the dry run's job actually trains.

A meta model holds no values, so its forward, backward and optimizer step cannot run (FSDP2 refuses
meta parameters at its lazy init; masks and `.item()` need data). The twin is the job's own
architecture class built from a copy of its config with the sizes that only scale the arithmetic
reduced: hidden size, heads, intermediate sizes, layers, experts. The module tree, parameter names,
dtypes, the quantizer and the LoRA targets are unchanged, and it lives on the CPU with real (random)
values, so the job's forward, backward and first optimizer step run for real through its own code.

What is kept whole, and why:
- the vocabulary: the job's real tokenizer produces ids up to the real vocab size;
- every dim-0 size of the twin is at least min(its real size, the world size), so each rank holds
  rows of each parameter wherever it does at the real size (a smaller dim would leave ranks empty
  that are not empty on the cluster): head_dim grows with the world up to its real value, then
  kv heads (up to the real count);
- everything not listed in `_shrink_one` (rope settings, norms, dropout, special token ids ...).

Memory figures never come from the twin: they come from the real config (see `fullsize`).
"""

from __future__ import annotations

import copy
from typing import Any

# Per-layer lists in configs (layer_types, ...): truncated with the layer count.
_PER_LAYER = ("layer_types", "sliding_window_pattern_list", "mlp_only_layers_list")
_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_INTERMEDIATE = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                 "ffn_hidden_size")
TWIN_LAYERS = 2
TWIN_HEADS = 4


def shrink(config, world_size: int):
    """A copy of `config` at the twin's sizes (sub-configs such as `text_config` shrunk too)."""
    twin = copy.deepcopy(config)
    _shrink_one(twin, world_size)
    for name in ("text_config", "language_config", "llm_config"):
        sub = getattr(twin, name, None)
        if sub is not None and hasattr(sub, "hidden_size"):
            _shrink_one(sub, world_size)
    return twin


def _ceil_to(n: int, k: int) -> int:
    return -(-n // k) * k


def _shrink_one(cfg: Any, world_size: int) -> None:
    heads = getattr(cfg, "num_attention_heads", None)
    hidden = getattr(cfg, "hidden_size", None)
    if not isinstance(heads, int) or not isinstance(hidden, int) or heads < 1:
        return
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    real_head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    # Keep grouped-query attention grouped (more query heads than kv heads when the real model has
    # them), at no more heads than that needs.
    ratio = min(max(heads // kv, 1), TWIN_HEADS) if heads % kv == 0 else 1
    # dim 0 of q/k/v and of per-head norms is a multiple of head_dim: wide enough that every rank
    # holds rows of it whenever it does at the real size.
    head_dim = max(16, min(real_head_dim, _ceil_to(world_size, 8)))
    twin_kv = min(kv, max(TWIN_HEADS // ratio, 1, -(-world_size // head_dim)))
    twin_heads = min(heads, max(TWIN_HEADS, twin_kv * ratio))
    while twin_heads % twin_kv:
        twin_kv -= 1
    twin_hidden = twin_heads * head_dim
    cfg.num_attention_heads = twin_heads
    if hasattr(cfg, "num_key_value_heads"):
        cfg.num_key_value_heads = twin_kv
    if getattr(cfg, "head_dim", None) is not None:
        cfg.head_dim = head_dim
    cfg.hidden_size = twin_hidden
    for name in _INTERMEDIATE:
        if isinstance(getattr(cfg, name, None), int) and getattr(cfg, name) > 0:
            setattr(cfg, name, max(2 * twin_hidden, _ceil_to(world_size, 8)))
    layers = getattr(cfg, "num_hidden_layers", None)
    if isinstance(layers, int) and layers > TWIN_LAYERS:
        cfg.num_hidden_layers = TWIN_LAYERS
        for name in _PER_LAYER:
            v = getattr(cfg, name, None)
            if isinstance(v, list) and len(v) == layers:
                setattr(cfg, name, v[:TWIN_LAYERS])
        if isinstance(getattr(cfg, "first_k_dense_replace", None), int):
            cfg.first_k_dense_replace = min(cfg.first_k_dense_replace, 1)
    experts = None
    for name in _EXPERTS:
        n = getattr(cfg, name, None)
        if isinstance(n, int) and n > 0:
            # Fused expert weights have the expert count as dim 0: as many as the world needs.
            experts = min(n, max(4, world_size))
            setattr(cfg, name, experts)
    top = getattr(cfg, "num_experts_per_tok", None)
    if isinstance(top, int) and experts:
        cfg.num_experts_per_tok = min(top, experts)


def build(cls, config, dtype, quant):
    """The twin of `cls(config)` on the CPU with random values, quantized by transformers' own
    bitsandbytes quantizer when `quant` is a BitsAndBytesConfig (then each 4-/8-bit weight is
    quantized for real, on the CPU, by bitsandbytes)."""
    import torch

    with torch.device("cpu"):
        model = cls._from_config(config, dtype=dtype)
    if quant is not None:
        _quantize(model, quant, dtype)
    return model


def _quantize(model, quant, dtype) -> None:
    import torch

    from fsdplint.audit.build import quantize_as_from_pretrained

    # The quantizer swaps nn.Linear for bitsandbytes modules with empty (meta) weights, as
    # from_pretrained does before it loads the checkpoint; the values it would load are the twin's.
    saved = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=False).items()}
    quantizer = quantize_as_from_pretrained(model, quant, dtype)
    import bitsandbytes as bnb

    storage = getattr(quant, "bnb_4bit_quant_storage", None) or torch.uint8
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, bnb.nn.Linear4bit) and module.weight.is_meta:
            w = module.weight
            data = saved[prefix + "weight"].to(dtype if dtype.is_floating_point else torch.bfloat16)
            p = bnb.nn.Params4bit(data, requires_grad=False, quant_type=w.quant_type, quant_storage=storage,
                                  blocksize=w.blocksize, compress_statistics=w.compress_statistics, module=module)
            module.weight = p._quantize("cpu")
        elif isinstance(module, bnb.nn.Linear8bitLt) and module.weight.is_meta:
            data = saved[prefix + "weight"].to(torch.float16)
            module.weight = bnb.nn.Int8Params(data, requires_grad=False, has_fp16_weights=False)._quantize("cpu")
    for mname, module in model.named_modules():  # what the swap left empty (new biases): the saved values
        prefix = f"{mname}." if mname else ""
        for pname, p in list(module.named_parameters(recurse=False)):
            if p.is_meta:
                value = saved.get(prefix + pname)
                new = value.to(p.dtype) if value is not None else torch.zeros(p.shape, dtype=p.dtype)
                setattr(module, pname, torch.nn.Parameter(new, requires_grad=p.requires_grad))
        for bname, b in list(module.named_buffers(recurse=False)):
            if b is not None and b.is_meta:
                value = saved.get(prefix + bname)
                module._buffers[bname] = value if value is not None else torch.zeros(b.shape, dtype=b.dtype)
    model.hf_quantizer = quantizer
    model.is_loaded_in_4bit = bool(quant.load_in_4bit)
    model.is_loaded_in_8bit = bool(quant.load_in_8bit)


def sizes(config) -> str:
    """The twin's sizes, for the report."""
    keys = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
            "num_hidden_layers", "vocab_size")
    return ", ".join(f"{k}={getattr(config, k)}" for k in keys if getattr(config, k, None) is not None)
