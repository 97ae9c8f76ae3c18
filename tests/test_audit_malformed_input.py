"""Malformed model-audit input beyond tests/test_audit_cli.py: one line naming the field, exit 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fsdplint.audit.cli import model_command

TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}


def error_of(path, *args):
    r = CliRunner().invoke(model_command, [str(path), *args])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code == 2, r.output
    err = r.output.strip()
    assert err.startswith("fsdplint: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_invalid_toml_names_the_file_and_line(tmp_path):
    p = tmp_path / "spec.toml"
    p.write_text('model = "config.json"\n[lora]\nr = = 8\n')
    err = error_of(p)
    assert str(p) in err and "invalid TOML" in err and "line 3" in err


@pytest.mark.parametrize("spec,needle", [
    ({"fsdp": {"world_size": 8}}, "missing 'model' section"),
    ({"model": {"hidden_size": 64}}, "model: unknown key 'hidden_size'"),
    ({"model": {"config": {"hidden_size": 64}}}, "not a Hugging Face config"),
    ({"model": {"config": TINY, "factory": "x:y"}}, "exactly one of 'config' and 'factory'"),
    ({"model": TINY, "lora": 8}, "lora: expected LoraConfig fields"),
    ({"model": TINY, "fsdp": [2]}, "fsdp: expected an object"),
    ({"model": TINY, "fsdp": {"world_size": "eight"}}, "fsdp.world_size: expected an integer >= 1"),
    ({"model": TINY, "fsdp": {"world_size": 0}}, "fsdp.world_size: expected an integer >= 1"),
    ({"model": TINY, "fsdp": {"wrap": 3}}, "fsdp.wrap: expected a list of module class names"),
    ({"model": TINY, "fsdp": {"use_orig_params": "yes"}}, "fsdp.use_orig_params: expected true or false"),
    ({"model": TINY, "fsdp": {"wrapp": ["X"]}}, "fsdp: unknown key 'wrapp'"),
    ({"model": TINY, "fsdp": {"mixed_precision": {"param_dtype": "fp8"}}}, "fsdp.mixed_precision.param_dtype: unknown dtype 'fp8'"),
    ({"model": TINY, "quantization": {"load_in_4bit": True, "bnb_4bit_quant_storage": "int3"}},
     "quantization.bnb_4bit_quant_storage: unknown dtype 'int3'"),
    ({"model": TINY, "quantization": "3bit"}, "quantization: expected BitsAndBytesConfig fields"),
    ({"model": TINY, "gpu_memory": True}, "gpu_memory: expected a memory size"),
    ({"model": TINY, "trust_remote_code": "yes"}, "trust_remote_code: expected true or false"),
    ({"model": TINY, "modle": {}}, "unknown section 'modle'"),
    ({"model": {**TINY, "model_type": "lama"}}, "model_type: 'lama' is not a model type"),
    ({"model": TINY, "lora": {"r": "eight", "target_modules": ["q_proj"]}}, "lora.r: expected int, got 'eight'"),
    ({"model": TINY, "lora": {"r": 8, "target_modules": 5}}, "lora.target_modules: expected"),
    ({"model": TINY, "lora": {"r": 8, "target_modules": ["q_proj"], "lora_dropout": "high"}}, "lora.lora_dropout: expected float"),
    ({"model": TINY, "lora": {"r": 8, "target_modules": []}}, "lora.target_modules: empty list"),
    ({"model": TINY, "lora": {"r": 0, "target_modules": ["q_proj"]}}, "lora: peft could not apply the LoRA config: `r`"),
    ({"model": TINY, "lora": {"r": 8, "target_modules": ["q_proj"], "init_lora_weights": "bogus"}},
     "lora: peft could not apply the LoRA config: Unknown initialization init_lora_weights"),
    ({"model": TINY, "lora": {"r": 8, "target_modules": ["q_proj"], "layers_pattern": "layers"}},
     "lora: When `layers_pattern` is specified, `layers_to_transform`"),
])
def test_malformed_spec_field(tmp_path, spec, needle):
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(spec, indent=2))
    err = error_of(p)
    assert str(p) in err and needle in err, err


def test_lora_json_given_on_the_command_line(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(TINY))
    assert "--lora: invalid JSON" in error_of(p, "--lora", "{r: 8}")


def test_unreadable_and_non_object_configs(tmp_path):
    p = tmp_path / "config.json"
    p.write_bytes(b"\xff\xfe\x00garbage")
    assert f"{p}: cannot read config" in error_of(p)
    p.write_text("[1, 2, 3]")
    assert f"{p}: expected a JSON object" in error_of(p)
    missing = tmp_path / "spec.json"
    missing.write_text(json.dumps({"model": "nowhere/config.json"}))
    assert "nowhere/config.json: model config not found" in error_of(missing)
