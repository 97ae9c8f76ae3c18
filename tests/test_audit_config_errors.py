"""Impossible or broken config.json values: one line naming the field, exit 2, in text and JSON output.

Before, some were tracebacks with exit 1 (a CI reads that as findings) and some built a wrong model
silently (no layers, a default hidden size, a Llama shown as another architecture).
"""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from fsdplint.audit.cli import model_command

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 256,
         "torch_dtype": "bfloat16", "pad_token_id": 0}


def write(tmp_path, **changes):
    cfg = dict(LLAMA)
    for k, v in changes.items():
        if v is _DROP:
            cfg.pop(k)
        else:
            cfg[k] = v
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))  # NaN is written as the bare NaN that json.loads accepts
    return p


_DROP = object()

CASES = [
    ({"hidden_size": 250}, "hidden_size: 250 is not a multiple of num_attention_heads 8"),
    ({"hidden_size": "256"}, "hidden_size: expected a positive integer, got '256'"),
    ({"hidden_size": 1.5}, "hidden_size: expected a positive integer, got 1.5"),
    ({"hidden_size": math.nan}, "hidden_size: expected a positive integer, got nan"),
    ({"hidden_size": 0}, "hidden_size: expected a positive integer, got 0"),
    ({"pad_token_id": 256}, "pad_token_id: 256 is not a token id below vocab_size 256"),
    ({"num_hidden_layers": 0}, "num_hidden_layers: expected a positive integer, got 0"),
    ({"num_hidden_layers": -3}, "num_hidden_layers: expected a positive integer, got -3"),
    ({"hidden_size": _DROP}, "hidden_size: missing (transformers would build LlamaConfig's default 4096"),
    ({"torch_dtype": "int8"}, "torch_dtype: 'int8' is not a dtype model weights are loaded in"),
    ({"architectures": ["FooForCausalLM"]}, "architectures: 'FooForCausalLM' is not a class transformers"),
    ({"architectures": ["MistralForCausalLM"]}, "architectures: MistralForCausalLM is built from MistralConfig"),
    ({"num_key_value_heads": 3}, "num_key_value_heads: 8 attention heads cannot be split into 3"),
    # Not in fsdplint's own checks: transformers' strict config dataclass names the field itself, or its
    # validator's message and the failing lookup are traced back to the field.
    ({"rms_norm_eps": "small"}, "rms_norm_eps"),
    ({"hidden_size": 250, "head_dim": 16}, "hidden_size: The hidden size (250) is not a multiple"),
    ({"rope_scaling": {"rope_type": "bogus"}}, "rope_scaling.rope_type: 'bogus' is not a value transformers knows"),
    ({"hidden_act": "nope"}, "hidden_act: 'nope' is not a value transformers knows"),
]


@pytest.mark.parametrize("changes,needle", CASES, ids=[next(iter(c)) + "-" + str(i) for i, (c, _) in enumerate(CASES)])
def test_bad_value_is_one_line_exit_2(tmp_path, changes, needle):
    p = write(tmp_path, **changes)
    r = CliRunner().invoke(model_command, [str(p), "--lora"])
    assert r.exit_code == 2, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    err = r.stderr.strip()
    assert err.startswith(f"fsdplint: error: {p}: ") and "\n" not in err and "Traceback" not in err, err
    assert needle in err, err
    assert r.stdout == ""


@pytest.mark.parametrize("changes,needle", CASES[:3] + CASES[8:11])
def test_json_output_carries_the_error_as_an_object(tmp_path, changes, needle):
    p = write(tmp_path, **changes)
    r = CliRunner().invoke(model_command, [str(p), "--lora", "--output-format", "json"])
    assert r.exit_code == 2
    data = json.loads(r.stdout)
    assert data["error"]["kind"] == "input" and needle in data["error"]["message"]
    assert data["findings"] == [] and data["config"] == str(p)


def test_a_good_config_still_builds(tmp_path):
    r = CliRunner().invoke(model_command, [str(write(tmp_path)), "--lora", "--output-format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["model"]["architecture"] == "LlamaForCausalLM"


def test_fsdp_version_banana_in_an_accelerate_yaml_is_refused(tmp_path):
    from fsdplint.cli import main as cli_main

    y = tmp_path / "fsdp.yaml"
    y.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                 "  fsdp_version: banana\n")
    s = tmp_path / "train.py"
    s.write_text("import torch\n")
    r = CliRunner().invoke(cli_main, [str(s), "--accelerate-config", str(y)])
    assert r.exit_code == 2, r.output
    assert f"{y}:4: fsdp_version: expected 1 or 2, got 'banana'" in r.stderr
