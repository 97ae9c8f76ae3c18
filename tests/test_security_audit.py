"""The model audit: no remote code unless asked, no network, no unpickling, no runaway configs."""

from __future__ import annotations

import json
import pickle
import socket

import pytest
from click.testing import CliRunner

from fsdplint.audit.cli import model_command


def audit(*args):
    r = CliRunner().invoke(model_command, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    return r


def one_line_error(r):
    assert r.exit_code == 2, r.output
    err = r.output.strip()
    assert err.startswith("fsdplint: error: ") and "\n" not in err, err
    return err


REMOTE = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128,
          "auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}}


def test_remote_code_in_an_inline_spec_is_refused_and_never_imported(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "modeling_evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n")
    spec = tmp_path / "spec.json"
    # A model type transformers ships: its own classes are built, auto_map is ignored (and said so).
    spec.write_text(json.dumps({"model": REMOTE, "fsdp": {"world_size": 2}, "lora": True}))
    r = audit(spec, "--output-format", "json")
    assert r.exit_code == 0, r.output
    assert any(n.startswith("auto_map ignored") for n in json.loads(r.stdout)["notes"])
    # A model type only the custom code defines: refused unless asked for.
    custom = dict(REMOTE, model_type="evil_llama")
    spec.write_text(json.dumps({"model": custom, "fsdp": {"world_size": 2}}))
    err = one_line_error(audit(spec))
    assert "auto_map" in err and "--trust-remote-code" in err and str(spec) in err
    # trust_remote_code given in the spec counts as asking; an inline config has no code next to it.
    spec.write_text(json.dumps({"model": {"config": custom, "trust_remote_code": True}, "fsdp": {"world_size": 2}}))
    err = one_line_error(audit(spec))
    assert "no .py files are next to config.json" in err
    assert not marker.exists()  # custom code from a hub repo is never fetched nor run


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def no_unpickling(monkeypatch):
    import torch

    def refuse(*args, **kwargs):
        raise AssertionError("unpickling attempted")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)


def test_audit_works_offline_without_unpickling(no_network, no_unpickling, fixtures_dir):
    models = fixtures_dir / "models"
    r = audit(models / "gpt2.json", "--target-modules", "c_attn", "--world-size", "4", "--output-format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["model"]["params"] > 100_000_000
    r = audit(models / "bad_llama3_8b_qlora_fsdp2.json", "--output-format", "json")
    assert r.exit_code == 1, r.output
    assert "FSDP201" in {f["code"] for f in json.loads(r.stdout)["findings"]}


BASE = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("change,field", [
    ({"num_hidden_layers": 10**6}, "num_hidden_layers"),
    ({"hidden_size": 10**7}, "hidden_size"),
    ({"vocab_size": 10**9, "hidden_size": 16384}, "vocab_size"),
    ({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 10**6}, "num_local_experts"),
    ({"text_config": {"num_hidden_layers": 10**6, "hidden_size": 64}}, "text_config.num_hidden_layers"),
])
def test_absurd_configs_are_refused_before_building(tmp_path, change, field):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**BASE, **change}))
    err = one_line_error(audit(cfg))
    assert f"{cfg}: {field}: " in err and "parameters" in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [["--world-size", "1000000000"], ["--fsdp", "1", "--world-size", "100000"]])
def test_absurd_world_size_is_refused(fixtures_dir, args):
    err = one_line_error(audit(fixtures_dir / "models" / "gpt2.json", *args))
    assert "--world-size" in err and "16,384" in err
