"""Tiny model configs for the audit examples in rule files (real architectures, toy sizes).

Kept free of torch imports: rule files import this at registry load time.
"""

from __future__ import annotations

_BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256,
         "torch_dtype": "bfloat16"}

_ARCH = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False},
    "qwen2": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "tie_word_embeddings": True},
    "mistral": {"model_type": "mistral", "architectures": ["MistralForCausalLM"]},
    "mixtral": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "deepseek_v3": {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "n_routed_experts": 4,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
                    "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "q_lora_rank": 32,
                    "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
                    "num_key_value_heads": 4},
    "qwen3_moe": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 32, "head_dim": 16,
                  "decoder_sparse_step": 1, "mlp_only_layers": []},
}


def tiny(arch: str = "llama", **overrides) -> dict:
    """A 2-layer, hidden-64 config dict of a real transformers architecture."""
    cfg = dict(_BASE, **_ARCH[arch])
    cfg.update(overrides)
    return cfg


def spec(arch: str = "llama", *, lora=None, quantization=None, fsdp=None, model=None, **extra) -> dict:
    """An audit-spec dict around `tiny(arch)`; LoRA on q_proj/v_proj unless `lora` says otherwise."""
    out = {"model": model if model is not None else tiny(arch)}
    out["lora"] = {"r": 8, "target_modules": ["q_proj", "v_proj"]} if lora is None else lora
    if out["lora"] is False:
        del out["lora"]
    if quantization is not None:
        out["quantization"] = quantization
    out["fsdp"] = dict({"version": 2, "world_size": 4}, **(fsdp or {}))
    out.update(extra)
    return out
