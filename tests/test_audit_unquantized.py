"""`--quant 4bit` says what bitsandbytes leaves in the model dtype (fused MoE experts above all)."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("bitsandbytes")

from fsdplint.audit.runner import run_audit  # noqa: E402
from fsdplint.audit.spec import load_spec  # noqa: E402

H, I, L, E, V = 256, 512, 2, 4, 1000
MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": H, "intermediate_size": I,
           "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": L, "num_local_experts": E,
           "num_experts_per_tok": 2, "vocab_size": V, "torch_dtype": "bfloat16"}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
         "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": L, "vocab_size": V,
         "torch_dtype": "bfloat16"}


def note(tmp_path, cfg, quant="4bit"):
    path = tmp_path / f"{cfg['model_type']}.json"
    path.write_text(json.dumps(cfg))
    spec = load_spec(str(path), {"quant": quant, "fsdp": "1", "world_size": 2, "lora": "default"})
    return [n for n in run_audit(spec).notes if n.startswith("unquantized:")]


def millions(text: str, what: str) -> float:
    return float(re.search(rf"([\d.]+) M in {what}", text).group(1))


def test_mixtral_experts_stay_in_bf16_under_4bit(tmp_path):
    (n,) = note(tmp_path, MIXTRAL)
    # gate/up/down of every expert in every layer: what the fused 3-D tensors hold.
    assert millions(n, "MoE expert parameters") == pytest.approx(L * E * 3 * H * I / 1e6, abs=0.01)
    assert millions(n, "embeddings and lm_head") == pytest.approx(2 * V * H / 1e6, abs=0.01)
    share = int(re.search(r"\((\d+)%\)", n).group(1))
    assert share > 80


def test_a_dense_model_keeps_only_embeddings_and_norms(tmp_path):
    (n,) = note(tmp_path, LLAMA)
    assert "MoE expert" not in n and "embeddings and lm_head" in n


def test_no_note_without_quantization(tmp_path):
    assert note(tmp_path, MIXTRAL, quant="none") == []
