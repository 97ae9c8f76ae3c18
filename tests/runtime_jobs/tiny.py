"""A tiny Llama-style model with real weights, LoRA and FSDP2, for the runtime tests."""

import torch
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import fully_shard
from transformers import LlamaConfig, LlamaForCausalLM

CONFIG = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def base_model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**CONFIG)).to(dtype)


def add_lora(model, r=8, seed=None, **kwargs):
    if seed is not None:
        torch.manual_seed(seed)
    config = LoraConfig(r=r, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return get_peft_model(model, config, **kwargs)


def shard(model, mesh=None, root=True, **kwargs):
    """The canonical FSDP2 recipe: every decoder layer, then the root."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for layer in base.model.layers:
        fully_shard(layer, mesh=mesh, **kwargs)
    if root:
        fully_shard(model, mesh=mesh, **kwargs)
    return model


def train_steps(model, optimizer, steps=2):
    losses = []
    torch.manual_seed(1234)
    for _ in range(steps):
        ids = torch.randint(0, CONFIG["vocab_size"], (2, 16))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
