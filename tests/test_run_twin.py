"""The shrunk twin `fsdplint run` trains, and the step checks it runs on the live model: real
transformers / peft / bitsandbytes on the CPU, configs written here, no downloads."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from fsdplint.run import twin  # noqa: E402


def _configs():
    from transformers import LlamaConfig, MixtralConfig, Qwen3Config

    return {
        # Llama-3-70B's sizes: grouped-query attention 64/8
        "llama70b": (LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                 num_attention_heads=64, num_key_value_heads=8, vocab_size=128256),
                     "LlamaForCausalLM"),
        # an explicit head_dim that is not hidden/heads, as Qwen3 writes it
        "qwen3": (Qwen3Config(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                              num_key_value_heads=8, head_dim=128, vocab_size=4096), "Qwen3ForCausalLM"),
        # experts and top-k
        "mixtral": (MixtralConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                  num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                                  num_experts_per_tok=2, vocab_size=4096), "MixtralForCausalLM"),
    }


def _names(model) -> dict:
    return {n: p.dtype for n, p in model.named_parameters() if ".layers." not in n or ".layers.0." in n
            or ".layers.1." in n}


@pytest.mark.parametrize("arch", ["llama70b", "qwen3", "mixtral"])
def test_twin_has_the_real_module_tree_dtypes_and_vocab_and_trains(arch):
    import transformers

    config, cls_name = _configs()[arch]
    cls = getattr(transformers, cls_name)
    small = twin.shrink(config, world_size=64)
    model = twin.build(cls, small, torch.bfloat16, None)
    with torch.device("meta"):
        real = cls._from_config(config, dtype=torch.bfloat16)
    assert _names(model) == _names(real)  # same names and dtypes, two layers
    assert model.get_input_embeddings().weight.shape[0] == config.vocab_size  # the real tokenizer's ids fit
    # at world size 64 every rank holds rows of each parameter wherever it does at the real size
    shapes = dict(real.named_parameters())
    assert all(p.shape[0] >= min(shapes[n].shape[0], 64) for n, p in model.named_parameters())
    assert sum(p.numel() for p in model.parameters()) < 80_000_000  # 128k vocab x 256 twice, the rest small
    ids = torch.randint(0, config.vocab_size, (2, 8))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert config.hidden_size != small.hidden_size and config.num_hidden_layers != small.num_hidden_layers


def test_twin_4bit_weights_are_quantized_for_real_in_their_storage_dtype():
    import bitsandbytes as bnb
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    config, _ = _configs()["llama70b"]
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
                               bnb_4bit_quant_storage=torch.bfloat16)
    model = twin.build(LlamaForCausalLM, twin.shrink(config, 8), torch.bfloat16, quant)
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, bnb.nn.Linear4bit)
    assert q.weight.dtype == torch.bfloat16 and q.weight.quant_state is not None and not q.weight.is_meta
    assert q.weight.numel() * 2 * 2 == q.in_features * q.out_features  # four 4-bit values per bf16 element
    assert not any(p.is_meta for p in model.parameters())
    ids = torch.randint(0, 100, (1, 6))
    assert torch.isfinite(model(input_ids=ids, labels=ids).loss)


@pytest.fixture(scope="module")
def lora_model():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=128)
    return get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))


def _step_findings(model, params, loss_of):
    from fsdplint.run import live

    model.zero_grad(set_to_none=True)
    opt = torch.optim.AdamW(params, lr=1e-4)
    ids = torch.randint(0, 100, (1, 6))
    loss_of(model, ids).backward()
    return live.step_checks(model, opt, {"on": False, "reentrant": False})


def _lm_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def test_step_check_names_trainable_params_the_optimizer_does_not_hold(lora_model):
    only_a = [p for n, p in lora_model.named_parameters() if "lora_A" in n]
    found = _step_findings(lora_model, only_a, _lm_loss)
    assert [f["code"] for f in found] == ["FSDP504"]
    assert "4 trainable parameters" in found[0]["message"] and "lora_B" in found[0]["message"]
    assert "not in the optimizer" in found[0]["message"]


def test_step_check_names_trainable_params_no_gradient_reached(lora_model):
    # A loss on the first layer's output: the second layer's adapters get no gradient.
    def first_layer_loss(model, ids):
        return model(input_ids=ids, output_hidden_states=True).hidden_states[1].float().pow(2).mean()

    trainable = [p for p in lora_model.parameters() if p.requires_grad]
    found = _step_findings(lora_model, trainable, first_layer_loss)
    assert [f["code"] for f in found] == ["FSDP504"]
    assert "got no gradient" in found[0]["message"] and "layers.1." in found[0]["message"]
    assert "layers.0." not in found[0]["message"]


def test_step_check_is_silent_when_every_trainable_param_is_updated(lora_model):
    trainable = [p for p in lora_model.parameters() if p.requires_grad]
    assert _step_findings(lora_model, trainable, _lm_loss) == []
