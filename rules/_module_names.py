"""Module names per architecture family, for LoRA `target_modules` checks (FSDP113).

Generated from the modeling code of transformers 5.24 (every named module of a small model built on the
meta device, last name segment), plus the names earlier transformers releases used for MoE experts
(Mixtral `w1`/`w2`/`w3`, Qwen3-MoE `gate_proj`/`up_proj`/`down_proj`), which peft still accepts and remaps.
"""

from __future__ import annotations

FAMILIES: dict[str, frozenset[str]] = {
    "bert": frozenset({
        "LayerNorm", "activation", "attention", "dense", "dropout", "embeddings", "encoder", "intermediate",
        "intermediate_act_fn", "key", "layer", "output", "pooler", "position_embeddings", "query", "self",
        "token_type_embeddings", "value", "word_embeddings",
    }),
    "bloom": frozenset({
        "attention_dropout", "dense", "dense_4h_to_h", "dense_h_to_4h", "gelu_impl", "h", "input_layernorm",
        "lm_head", "ln_f", "mlp", "post_attention_layernorm", "query_key_value", "self_attention",
        "transformer", "word_embeddings", "word_embeddings_layernorm",
    }),
    "cohere": frozenset({
        "act_fn", "down_proj", "embed_tokens", "gate_proj", "input_layernorm", "k_proj", "layers", "lm_head",
        "mlp", "model", "norm", "o_proj", "q_proj", "rotary_emb", "self_attn", "up_proj", "v_proj",
    }),
    "deepseek_v3": frozenset({
        "act_fn", "down_proj", "embed_tokens", "gate_proj", "input_layernorm", "kv_a_layernorm",
        "kv_a_proj_with_mqa", "kv_b_proj", "layers", "lm_head", "mlp", "model", "norm", "o_proj",
        "post_attention_layernorm", "q_a_layernorm", "q_a_proj", "q_b_proj", "rotary_emb", "self_attn",
        "up_proj",
    }),
    "falcon": frozenset({
        "act", "attention_dropout", "dense", "dense_4h_to_h", "dense_h_to_4h", "h", "input_layernorm",
        "lm_head", "ln_f", "mlp", "query_key_value", "rotary_emb", "self_attention", "transformer",
        "word_embeddings",
    }),
    "gemma": frozenset({
        "act_fn", "down_proj", "embed_tokens", "gate_proj", "input_layernorm", "k_proj", "layers", "lm_head",
        "mlp", "model", "norm", "o_proj", "post_attention_layernorm", "q_proj", "rotary_emb", "self_attn",
        "up_proj", "v_proj",
    }),
    "gemma2": frozenset({
        "act_fn", "down_proj", "embed_tokens", "gate_proj", "input_layernorm", "k_proj", "layers", "lm_head",
        "mlp", "model", "norm", "o_proj", "post_attention_layernorm", "post_feedforward_layernorm",
        "pre_feedforward_layernorm", "q_proj", "rotary_emb", "self_attn", "up_proj", "v_proj",
    }),
    "gemma3_text": frozenset({
        "act_fn", "down_proj", "embed_tokens", "gate_proj", "input_layernorm", "k_norm", "k_proj", "layers",
        "lm_head", "mlp", "model", "norm", "o_proj", "post_attention_layernorm",
        "post_feedforward_layernorm", "pre_feedforward_layernorm", "q_norm", "q_proj", "rotary_emb",
        "self_attn", "up_proj", "v_proj",
    }),
    "gpt2": frozenset({
        "act", "attn", "attn_dropout", "c_attn", "c_fc", "c_proj", "drop", "dropout", "h", "lm_head", "ln_1",
        "ln_2", "ln_f", "mlp", "resid_dropout", "transformer", "wpe", "wte",
    }),
    "gpt_bigcode": frozenset({
        "act", "attn", "c_attn", "c_fc", "c_proj", "drop", "dropout", "h", "lm_head", "ln_1", "ln_2", "ln_f",
        "mlp", "resid_dropout", "transformer", "wpe", "wte",
    }),
    "gpt_neox": frozenset({
        "act", "attention", "dense", "dense_4h_to_h", "dense_h_to_4h", "emb_dropout", "embed_in",
        "final_layer_norm", "gpt_neox", "input_layernorm", "layers", "lm_head", "mlp",
        "post_attention_dropout", "post_attention_layernorm", "post_mlp_dropout", "query_key_value",
        "rotary_emb",
    }),
    "gpt_oss": frozenset({
        "embed_tokens", "experts", "input_layernorm", "k_proj", "layers", "lm_head", "mlp", "model", "norm",
        "o_proj", "post_attention_layernorm", "q_proj", "rotary_emb", "router", "self_attn", "v_proj",
    }),
    "gptj": frozenset({
        "act", "attn", "drop", "dropout", "fc_in", "fc_out", "h", "k_proj", "lm_head", "ln_1", "ln_f", "mlp",
        "out_proj", "q_proj", "resid_dropout", "rotary_emb", "transformer", "v_proj", "wte",
    }),
    "llama": frozenset({
        "act_fn", "down_proj", "embed_tokens", "gate_proj", "input_layernorm", "k_proj", "layers", "lm_head",
        "mlp", "model", "norm", "o_proj", "post_attention_layernorm", "q_proj", "rotary_emb", "self_attn",
        "up_proj", "v_proj",
    }),
    "llama4_text": frozenset({
        "act_fn", "activation_fn", "down_proj", "embed_tokens", "experts", "feed_forward", "gate_proj",
        "input_layernorm", "k_proj", "layers", "lm_head", "model", "norm", "o_proj",
        "post_attention_layernorm", "q_proj", "qk_norm", "rotary_emb", "router", "self_attn",
        "shared_expert", "up_proj", "v_proj",
    }),
    "mistral": frozenset({
        "act_fn", "down_proj", "embed_tokens", "gate_proj", "input_layernorm", "k_proj", "layers", "lm_head",
        "mlp", "model", "norm", "o_proj", "post_attention_layernorm", "q_proj", "rotary_emb", "self_attn",
        "up_proj", "v_proj",
    }),
    "mixtral": frozenset({
        "act_fn", "block_sparse_moe", "embed_tokens", "experts", "gate", "input_layernorm", "k_proj",
        "layers", "lm_head", "mlp", "model", "norm", "o_proj", "post_attention_layernorm", "q_proj",
        "rotary_emb", "self_attn", "v_proj", "w1", "w2", "w3",
    }),
    "mpt": frozenset({
        "Wqkv", "act", "attn", "blocks", "down_proj", "ffn", "lm_head", "norm_1", "norm_2", "norm_f",
        "out_proj", "resid_attn_dropout", "transformer", "up_proj", "wte",
    }),
    "olmo2": frozenset({
        "act_fn", "down_proj", "embed_tokens", "gate_proj", "k_norm", "k_proj", "layers", "lm_head", "mlp",
        "model", "norm", "o_proj", "post_attention_layernorm", "post_feedforward_layernorm", "q_norm",
        "q_proj", "rotary_emb", "self_attn", "up_proj", "v_proj",
    }),
    "opt": frozenset({
        "activation_fn", "decoder", "embed_positions", "embed_tokens", "fc1", "fc2", "final_layer_norm",
        "k_proj", "layers", "lm_head", "model", "out_proj", "project_in", "project_out", "q_proj",
        "self_attn", "self_attn_layer_norm", "v_proj",
    }),
    "phi": frozenset({
        "activation_fn", "dense", "embed_dropout", "embed_tokens", "fc1", "fc2", "final_layernorm",
        "input_layernorm", "k_proj", "layers", "lm_head", "mlp", "model", "q_proj", "resid_dropout",
        "rotary_emb", "self_attn", "v_proj",
    }),
    "phi3": frozenset({
        "act_fn", "activation_fn", "down_proj", "embed_dropout", "embed_tokens", "gate_up_proj",
        "input_layernorm", "layers", "lm_head", "mlp", "model", "norm", "o_proj", "post_attention_layernorm",
        "qkv_proj", "resid_attn_dropout", "resid_mlp_dropout", "rotary_emb", "self_attn",
    }),
    "qwen2": frozenset({
        "act_fn", "down_proj", "embed_tokens", "gate_proj", "input_layernorm", "k_proj", "layers", "lm_head",
        "mlp", "model", "norm", "o_proj", "post_attention_layernorm", "q_proj", "rotary_emb", "self_attn",
        "up_proj", "v_proj",
    }),
    "qwen2_moe": frozenset({
        "act_fn", "down_proj", "embed_tokens", "experts", "gate", "gate_proj", "input_layernorm", "k_proj",
        "layers", "lm_head", "mlp", "model", "norm", "o_proj", "post_attention_layernorm", "q_proj",
        "rotary_emb", "self_attn", "shared_expert", "shared_expert_gate", "up_proj", "v_proj",
    }),
    "qwen3": frozenset({
        "act_fn", "down_proj", "embed_tokens", "gate_proj", "input_layernorm", "k_norm", "k_proj", "layers",
        "lm_head", "mlp", "model", "norm", "o_proj", "post_attention_layernorm", "q_norm", "q_proj",
        "rotary_emb", "self_attn", "up_proj", "v_proj",
    }),
    "qwen3_moe": frozenset({
        "act_fn", "down_proj", "embed_tokens", "experts", "gate", "gate_proj", "input_layernorm", "k_norm",
        "k_proj", "layers", "lm_head", "mlp", "model", "norm", "o_proj", "post_attention_layernorm",
        "q_norm", "q_proj", "rotary_emb", "self_attn", "up_proj", "v_proj",
    }),
    "roberta": frozenset({
        "LayerNorm", "activation", "attention", "dense", "dropout", "embeddings", "encoder", "intermediate",
        "intermediate_act_fn", "key", "layer", "output", "pooler", "position_embeddings", "query", "self",
        "token_type_embeddings", "value", "word_embeddings",
    }),
    "starcoder2": frozenset({
        "act", "c_fc", "c_proj", "embed_tokens", "input_layernorm", "k_proj", "layers", "lm_head", "mlp",
        "model", "norm", "o_proj", "post_attention_layernorm", "q_proj", "rotary_emb", "self_attn", "v_proj",
    }),
    "t5": frozenset({
        "DenseReluDense", "EncDecAttention", "SelfAttention", "act", "block", "decoder", "dropout",
        "embed_tokens", "encoder", "final_layer_norm", "k", "layer", "layer_norm", "lm_head", "o", "q",
        "relative_attention_bias", "shared", "v", "wi", "wo",
    }),
}

ALL_NAMES: frozenset[str] = frozenset().union(*FAMILIES.values())
