"""`fsdplint model` on a local model directory and on a hub model id read through huggingface_hub's cache.

The tests build the cache layout huggingface_hub writes (models--org--name/snapshots/<rev>/, refs/main)
in a temporary directory and set HF_HUB_OFFLINE=1: nothing touches the network, and no weights exist.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fsdplint.audit.cli import model_command
from fsdplint.audit.examples import tiny

REV = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(cache, repo, files: dict, rev=REV):
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / rev
    snap.mkdir(parents=True)
    for name, data in files.items():
        (snap / name).write_text(json.dumps(data))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(rev)
    return snap


@pytest.fixture
def hub(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def run(*args):
    r = CliRunner().invoke(model_command, [*map(str, args), "--output-format", "json"])
    return r.exit_code, r.stdout, r.stderr


def test_hub_id_reads_config_json_from_the_cache(hub):
    snap = cache_repo(hub, "acme/tiny-llama", {"config.json": tiny("llama")})
    code, out, err = run("acme/tiny-llama", "--target-modules", "q_proj,v_proj")
    assert code == 0, err
    data = json.loads(out)
    assert data["model"]["architecture"] == "LlamaForCausalLM"
    assert data["model"]["source"] == str(snap / "config.json")
    assert any("acme/tiny-llama read from the Hugging Face cache" in n for n in data["notes"])
    assert [c["modules"] for c in data["lora_coverage"]] == [2, 2]


def test_hub_revision_picks_another_snapshot(hub):
    cache_repo(hub, "acme/tiny-llama", {"config.json": tiny("llama")})
    other = "fedcba9876543210fedcba9876543210fedcba98"
    snap = hub / "models--acme--tiny-llama" / "snapshots" / other
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(tiny("llama", num_hidden_layers=3)))
    code, out, err = run(f"acme/tiny-llama@{other}", "--target-modules", "q_proj")
    assert code == 0, err
    assert [c["modules"] for c in json.loads(out)["lora_coverage"]] == [3]


def test_hub_adapter_repo_reads_adapter_config_and_its_base(hub):
    cache_repo(hub, "acme/tiny-llama", {"config.json": tiny("llama")})
    adapter = {"peft_type": "LORA", "base_model_name_or_path": "acme/tiny-llama", "r": 4,
               "target_modules": ["v_proj"], "lora_alpha": 8}
    cache_repo(hub, "acme/tiny-llama-lora", {"adapter_config.json": adapter})
    code, out, err = run("acme/tiny-llama-lora")
    assert code == 0, err
    data = json.loads(out)
    assert data["lora_coverage"] == [{"target": "v_proj", "modules": 2, "note": ""}]
    assert any("is a LoRA adapter" in n for n in data["notes"])


def test_lora_flag_takes_an_adapter_id(hub):
    cache_repo(hub, "acme/tiny-llama", {"config.json": tiny("llama")})
    cache_repo(hub, "acme/lora-q", {"adapter_config.json": {"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"]}})
    code, out, err = run("acme/tiny-llama", "--lora", "acme/lora-q")
    assert code == 0, err
    assert [c["target"] for c in json.loads(out)["lora_coverage"]] == ["q_proj"]


def test_offline_and_not_cached_is_one_line_exit_2(hub):
    code, out, err = run("acme/not-downloaded", "--lora")
    assert code == 2
    assert json.loads(out)["error"]["message"].startswith("acme/not-downloaded: no config.json or adapter_config.json")
    assert "HF_HUB_OFFLINE is set" in err and "\n" not in err.strip()


def test_local_model_directory(tmp_path):
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(tiny("qwen2")))
    (d / "model.safetensors").write_text("not weights: the audit must never open this file")
    code, out, err = run(d, "--target-modules", "q_proj")
    assert code == 0, err
    assert json.loads(out)["model"]["architecture"] == "Qwen2ForCausalLM"


def test_local_adapter_directory_uses_its_base_directory(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps(tiny("mistral")))
    ad = tmp_path / "adapter"
    ad.mkdir()
    (ad / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": str(base),
                                                        "r": 4, "target_modules": ["o_proj"]}))
    code, out, err = run(ad)
    assert code == 0, err
    data = json.loads(out)
    assert data["model"]["architecture"] == "MistralForCausalLM"
    assert [c["target"] for c in data["lora_coverage"]] == ["o_proj"]


def test_directory_without_configs_is_refused(tmp_path):
    code, out, err = run(tmp_path)
    assert code == 2 and "no config.json (or adapter_config.json) in this directory" in err


CONFIG_PY = '''from transformers import PretrainedConfig


class ToyConfig(PretrainedConfig):
    model_type = "toy_remote"

    def __init__(self, hidden_size=32, num_hidden_layers=2, vocab_size=64, **kw):
        self.hidden_size, self.num_hidden_layers, self.vocab_size = hidden_size, num_hidden_layers, vocab_size
        super().__init__(**kw)
'''
MODELING_PY = '''import torch.nn as nn
from transformers import PreTrainedModel

from .configuration_toy import ToyConfig


class ToyBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.q_proj = nn.Linear(c.hidden_size, c.hidden_size)


class ToyForCausalLM(PreTrainedModel):
    config_class = ToyConfig
    _no_split_modules = ["ToyBlock"]

    def __init__(self, c):
        super().__init__(c)
        self.layers = nn.ModuleList(ToyBlock(c) for _ in range(c.num_hidden_layers))
        self.post_init()
'''


def test_custom_model_type_runs_its_local_code_only_with_trust_remote_code(tmp_path):
    import os
    import subprocess
    import sys

    d = tmp_path / "toy"
    d.mkdir()
    (d / "configuration_toy.py").write_text(CONFIG_PY)
    (d / "modeling_toy.py").write_text(MODELING_PY)
    (d / "config.json").write_text(json.dumps({
        "model_type": "toy_remote", "architectures": ["ToyForCausalLM"], "hidden_size": 32, "num_hidden_layers": 3,
        "vocab_size": 64, "torch_dtype": "bfloat16",
        "auto_map": {"AutoConfig": "configuration_toy.ToyConfig", "AutoModelForCausalLM": "modeling_toy.ToyForCausalLM"}}))
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "fsdplint", "model", str(d), "--target-modules", "q_proj", "--world-size", "2",
           "--output-format", "json"]
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "pass --trust-remote-code" in refused.stderr
    ran = subprocess.run(cmd + ["--trust-remote-code"], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    data = json.loads(ran.stdout)
    assert data["model"]["architecture"] == "ToyForCausalLM"
    assert data["lora_coverage"][0]["modules"] == 3
    assert any("custom code next to config.json" in n for n in data["notes"])
