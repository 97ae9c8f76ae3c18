"""`fsdplint model` end to end on the shipped fixtures: report, findings, exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fsdplint.audit.cli import model_command

MODELS = "fixtures/models"


def run(*args):
    result = CliRunner().invoke(model_command, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, fixtures_dir):
    monkeypatch.chdir(fixtures_dir.parent)


def test_llama3_8b_lora_fsdp2_prints_report_and_exits_0():
    code, out = run(f"{MODELS}/llama3_8b.json", "--target-modules", "q_proj,v_proj", "--fsdp", "2",
                    "--world-size", "8", "--gpu-memory", "80GiB")
    assert code == 0, out
    assert "LlamaForCausalLM" in out and "8,033,669,120 params" in out
    assert "FSDP2 plan at world size 8" in out and "33 units" in out
    assert "Memory per rank" in out and "sharded parameters" in out
    assert "All checks passed." in out
    assert "gemm_4bit" not in out  # bitsandbytes' import-time warning stays hidden


@pytest.mark.parametrize("fixture,codes", [
    ("bad_llama3_8b_fsdp1_default_policy.json", {"FSDP004"}),
    ("bad_llama3_8b_qlora_fsdp2.json", {"FSDP201"}),
    ("bad_llama3_8b_qlora_fsdp1_uint8.json", {"FSDP202"}),
    ("bad_qwen2_tied_split.json", {"FSDP006"}),
    ("bad_gpt_oss_all_linear.json", {"FSDP301"}),
    ("bad_mistral_typo_targets.json", {"FSDP113"}),
    ("custom_moe_spec.json", {"FSDP301"}),
    ("bad_mixtral_expert_lora_fsdp1_peft_policy.json", {"FSDP303"}),
])
def test_bad_fixtures_report_their_codes_and_exit_1(fixture, codes):
    code, out = run(f"{MODELS}/{fixture}", "--output-format", "json")
    assert code == 1, out
    data = json.loads(out)
    found = {f["code"] for f in data["findings"]}
    assert codes <= found, found
    for f in data["findings"]:
        assert f["filename"].endswith(fixture)
        assert set(f) >= {"code", "name", "severity", "location", "end_location", "message", "url", "fix"}


def test_fsdp1_report_says_the_plan_is_computed():
    code, out = run(f"{MODELS}/bad_llama3_8b_fsdp1_default_policy.json")
    assert code == 1
    assert "computed, not executed" in out
    # One finding for the 32 identical decoder-layer units, not 32.
    assert out.count(": FSDP004 [") == 1 and "31 more units" in out


def test_finding_points_at_the_target_modules_line():
    code, out = run(f"{MODELS}/bad_mistral_typo_targets.json", "--output-format", "json")
    (f,) = [f for f in json.loads(out)["findings"] if f["code"] == "FSDP113"]
    lines = open(f"{MODELS}/bad_mistral_typo_targets.json").read().splitlines()
    assert '"target_modules"' in lines[f["location"]["row"] - 1]
    assert "vproj" in f["message"] and "v_proj" in f["message"]


def test_cli_flags_override_the_spec():
    code, out = run(f"{MODELS}/bad_mistral_typo_targets.json", "--target-modules", "q_proj,v_proj",
                    "--output-format", "json")
    assert code == 0, out
    cov = {c["target"]: c["modules"] for c in json.loads(out)["lora_coverage"]}
    assert cov == {"q_proj": 32, "v_proj": 32}


def test_toml_spec_gives_the_same_report_as_json():
    _, a = run(f"{MODELS}/llama3_8b_lora_fsdp2.json", "--output-format", "json")
    _, b = run(f"{MODELS}/llama3_8b_lora_fsdp2.toml", "--output-format", "json")
    a, b = json.loads(a), json.loads(b)
    assert a["memory"] == b["memory"] and a["fsdp"] == b["fsdp"] and a["model"]["params"] == b["model"]["params"]


def test_lora_from_adapter_config_json():
    code, out = run(f"{MODELS}/llama3_8b.json", "--lora", f"{MODELS}/adapter_config.json", "--world-size", "4",
                    "--output-format", "json")
    assert code == 0, out
    cov = {c["target"]: c["modules"] for c in json.loads(out)["lora_coverage"]}
    assert cov == {"k_proj": 32, "o_proj": 32, "q_proj": 32, "v_proj": 32}


def test_select_and_ignore_filter_findings():
    code, _ = run(f"{MODELS}/bad_mistral_typo_targets.json", "--ignore", "FSDP113")
    assert code == 0
    code, out = run(f"{MODELS}/bad_mistral_typo_targets.json", "--select", "FSDP9")
    assert code == 0 or "FSDP113" not in out


@pytest.mark.parametrize("args,needle", [
    (["malformed_json.json"], "malformed_json.json:2:"),
    (["malformed_fsdp_version.json"], "fsdp.version: expected 1 or 2"),
    (["does_not_exist.json"], "does_not_exist.json: config not found"),
    (["gpt2.json", "--gpu-memory", "lots"], "--gpu-memory: expected a memory size"),
    (["gpt2.json", "--lora", '{"r": 8, "target_modulez": ["c_attn"]}'], "unknown LoraConfig field 'target_modulez'"),
    (["gpt2.json", "--dtype", "float8"], "unknown dtype 'float8'"),
    (["adapter_config.json"], "neither a Hugging Face config"),
])
def test_malformed_input_is_one_line_and_exit_2(args, needle):
    args = [f"{MODELS}/{args[0]}", *args[1:]]
    result = CliRunner().invoke(model_command, args)
    assert result.exit_code == 2, result.output
    err = result.output.strip()
    assert err.startswith("fsdplint: error: ") and needle in err and "\n" not in err
    assert "Traceback" not in err


def test_remote_code_config_is_refused_without_the_flag(tmp_path):
    cfg = {"model_type": "my_custom", "architectures": ["MyCustomForCausalLM"],
           "auto_map": {"AutoModelForCausalLM": "modeling_my.MyCustomForCausalLM"}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    result = CliRunner().invoke(model_command, [str(path)])
    assert result.exit_code == 2
    assert "--trust-remote-code" in result.output


def test_target_torch_comes_from_the_project_unless_given(tmp_path, fixtures_dir):
    (tmp_path / "requirements.txt").write_text("torch==2.6.0\n")
    spec = tmp_path / "audit.json"
    spec.write_text(json.dumps({"model": str(fixtures_dir / "models" / "qwen2_5_0_5b.json"),
                                "lora": {"r": 8, "target_modules": ["q_proj", "v_proj"]},
                                "fsdp": {"version": 2, "world_size": 4}}))
    code, out = run(spec, "--output-format", "json")
    data = json.loads(out)
    assert (data["torch_version"], data["torch_version_source"]) == ("2.6.0", "requirements.txt: torch==2.6.0")
    (f,) = [f for f in data["findings"] if f["code"] == "FSDP005"]  # frozen bf16 + fp32 LoRA: one dtype < 2.8
    assert "torch 2.6.0 (requirements.txt: torch==2.6.0)" in f["message"] and code == 1
    code, out = run(spec, "--torch-version", "2.13", "--output-format", "json")
    assert code == 0 and json.loads(out)["torch_version"] == "2.13"
