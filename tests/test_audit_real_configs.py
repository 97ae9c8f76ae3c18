"""Real config.json files (fixtures/models/real/, values from the public hub configs) build and audit.

Most tests shrink the layer counts to two so the suite stays fast; the pre-quantized DeepSeek-V3
and gpt-oss-20b configs also run at full size, as the issue reported them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.audit import load_spec, run_audit
from fsdplint.audit.cli import model_command

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "models" / "real"
CONFIGS = sorted(REAL.glob("*.json"))


def shrink(cfg: dict, layers: int = 2) -> dict:
    """The same config with at most `layers` layers everywhere (text and vision towers)."""
    cfg = copy.deepcopy(cfg)

    def walk(d):
        n = d.get("num_hidden_layers")
        if isinstance(n, int):
            d["num_hidden_layers"] = min(n, layers)
            if isinstance(d.get("layer_types"), list):
                d["layer_types"] = d["layer_types"][: d["num_hidden_layers"]]
        if isinstance(d.get("first_k_dense_replace"), int):
            d["first_k_dense_replace"] = min(d["first_k_dense_replace"], layers - 1)
        for v in d.values():
            if isinstance(v, dict):
                walk(v)

    walk(cfg)
    return cfg


def small(tmp_path, name: str, **changes) -> Path:
    cfg = shrink(json.loads((REAL / f"{name}.json").read_text()))
    cfg.update(changes)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def audit(path, **flags):
    return run_audit(load_spec(path, flags))


def test_the_table_covers_the_architectures_the_docs_list():
    names = {p.stem for p in CONFIGS}
    for expected in ("meta-llama--Llama-3.1-8B", "meta-llama--Llama-4-Scout-17B-16E-Instruct", "Qwen--Qwen2.5-7B-Instruct",
                     "Qwen--Qwen3-8B", "Qwen--Qwen3-30B-A3B", "mistralai--Mixtral-8x7B-v0.1", "deepseek-ai--DeepSeek-V3",
                     "openai--gpt-oss-20b", "google--gemma-2-9b", "google--gemma-3-4b-it",
                     "microsoft--Phi-3-mini-4k-instruct", "microsoft--phi-4", "mistralai--Mistral-7B-v0.3"):
        assert expected in names
    docs = (REAL.parent.parent.parent / "docs" / "audit-architectures.md").read_text()
    for p in CONFIGS:
        assert p.stem.replace("--", "/") in docs, p.stem


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_real_config_builds_as_its_architecture(tmp_path, path):
    cfg = json.loads(path.read_text())
    p = tmp_path / "config.json"
    p.write_text(json.dumps(shrink(cfg)))
    r = CliRunner().invoke(model_command, [str(p), "--target-modules", "o_proj", "--world-size", "4",
                                           "--output-format", "json"])
    assert r.exit_code in (0, 1), r.stderr
    data = json.loads(r.stdout)
    assert data["model"]["architecture"] == cfg["architectures"][0]
    assert data["model"]["trainable_params"] > 0
    assert "FSDP901" not in {f["code"] for f in data["findings"]}


def test_deepseek_v3_full_size_needs_no_trust_remote_code():
    result = audit(REAL / "deepseek-ai--DeepSeek-V3.json", target_modules="q_b_proj,kv_b_proj", world_size=8)
    assert result.summary["architecture"] == "DeepseekV3ForCausalLM"
    assert result.summary["params"] > 6.7e11
    notes = " ".join(result.notes)
    assert "auto_map ignored: transformers" in notes and "'deepseek_v3'" in notes
    assert "fp8 pre-quantized checkpoint: audited dequantized to bfloat16" in notes
    assert "FineGrainedFP8Config(dequantize=True)" in notes


def test_gpt_oss_20b_mxfp4_full_size_is_audited_dequantized():
    result = audit(REAL / "openai--gpt-oss-20b.json", target_modules="q_proj,v_proj", world_size=8)
    assert result.summary["architecture"] == "GptOssForCausalLM" and result.summary["dtype"] == "bfloat16"
    assert any("mxfp4 pre-quantized checkpoint: audited dequantized to bfloat16" in n for n in result.notes)
    assert result.exit_code == 0, [f.message for f in result.findings]


def test_quant_flag_overrides_a_pre_quantized_config(tmp_path):
    p = small(tmp_path, "openai--gpt-oss-20b")
    none = audit(p, target_modules="q_proj", quant="none")
    assert not any("pre-quantized" in n for n in none.notes)
    assert any("quantization_config (mxfp4) ignored: --quant none" in n for n in none.notes)
    four = audit(p, target_modules="q_proj", quant="4bit", quant_storage="bfloat16", fsdp="2")
    assert four.summary["quantization"] == "4bit"
    assert "FSDP201" in {f.code for f in four.findings}  # 4-bit base sharded by FSDP2: audited as bnb 4-bit


def test_gptq_config_is_audited_dequantized(tmp_path):
    result = audit(REAL / "Qwen--Qwen2.5-7B-Instruct-GPTQ-Int4.json", target_modules="q_proj", world_size=8)
    assert result.summary["dtype"] == "float16"
    assert any(n.startswith("gptq pre-quantized checkpoint: audited dequantized to float16, as unquantized weights")
               for n in result.notes)


def test_unknown_quant_method_is_one_line(tmp_path):
    p = small(tmp_path, "Qwen--Qwen3-8B", quantization_config={"quant_method": "magic4"})
    r = CliRunner().invoke(model_command, [str(p), "--lora"])
    assert r.exit_code == 2 and "quant_method: 'magic4' is not a quantization method transformers knows" in r.stderr


def test_custom_model_type_still_needs_trust_remote_code(tmp_path):
    p = small(tmp_path, "Qwen--Qwen3-8B", model_type="acme_moe",
              auto_map={"AutoConfig": "configuration_acme.AcmeConfig"})
    r = CliRunner().invoke(model_command, [str(p), "--lora"])
    assert r.exit_code == 2 and "pass --trust-remote-code to run it" in r.stderr
    r = CliRunner().invoke(model_command, [str(p), "--lora", "--trust-remote-code"])
    assert r.exit_code == 2 and "no .py files are next to config.json" in r.stderr


# -- FSDP301: attention-only LoRA on MoE models is not a finding -----------------------------------
@pytest.mark.parametrize("fsdp", [{"fsdp": "2"}, {"fsdp": "1", "use_orig_params": True}])
def test_attention_only_lora_on_mixtral_is_not_fsdp301(tmp_path, fsdp):
    result = audit(small(tmp_path, "mistralai--Mixtral-8x7B-v0.1"), target_modules="q_proj,v_proj", **fsdp)
    assert "FSDP301" not in {f.code for f in result.findings}


def test_deepseek_v3_attention_names_it_lacks_are_fsdp113_not_fsdp301(tmp_path):
    result = audit(small(tmp_path, "deepseek-ai--DeepSeek-V3"), target_modules="q_proj,v_proj")
    codes = {f.code for f in result.findings}
    assert "FSDP113" in codes and "FSDP301" not in codes


def test_mlp_targets_on_gpt_oss_are_still_fsdp301(tmp_path):
    result = audit(small(tmp_path, "openai--gpt-oss-20b"), target_modules="all-linear")
    assert "FSDP301" in {f.code for f in result.findings}


# -- FSDP303: target_parameters adapters where their unit is not gathered -----------------------------
EXPERTS = {"target_modules": "w1,w2,w3"}  # peft 0.21 converts these to target_parameters on transformers 5


def test_fsdp2_per_decoder_layer_expert_lora_is_not_fsdp303(tmp_path):
    result = audit(small(tmp_path, "mistralai--Mixtral-8x7B-v0.1"), fsdp="2", **EXPERTS)
    assert "FSDP303" not in {f.code for f in result.findings}
    assert any(p.lora_reached for p in result_params(result))


def test_fsdp2_root_only_expert_lora_is_not_fsdp303(tmp_path):
    result = audit(small(tmp_path, "mistralai--Mixtral-8x7B-v0.1"), fsdp="2", wrap="NoSuchLayer", **EXPERTS)
    assert "FSDP303" not in {f.code for f in result.findings}


def test_fsdp1_decoder_layer_units_are_fsdp303(tmp_path):
    # Measured on CPU: FSDP1's flat-parameter views break peft's parametrization even in whole-layer units.
    result = audit(small(tmp_path, "mistralai--Mixtral-8x7B-v0.1"), fsdp="1", use_orig_params=True, **EXPERTS)
    (f,) = [f for f in result.findings if f.code == "FSDP303"]
    assert "FSDP1 flattens it into unit model.layers.0" in f.message and "Output 0 of View is a view" in f.message


def test_fsdp1_peft_policy_is_fsdp303(tmp_path):
    spec = {"model": json.loads(small(tmp_path, "mistralai--Mixtral-8x7B-v0.1").read_text()),
            "lora": {"r": 8, "target_modules": ["w1", "w2", "w3"]},
            "fsdp": {"version": 1, "auto_wrap_policy": "peft", "use_orig_params": True, "world_size": 4}}
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(spec))
    (f,) = [f for f in audit(p).findings if f.code == "FSDP303"]
    assert "Module already has an attribute named" in f.message and "gives each LoRA leaf a unit" in f.message


@pytest.mark.parametrize("wrap,read", [("MixtralExperts,MixtralDecoderLayer", "down_proj"),
                                       ("Linear,MixtralDecoderLayer", "lora_A.default.weight")])
def test_fsdp2_unit_rooted_below_the_param_wrapper_is_fsdp303(tmp_path, wrap, read):
    result = audit(small(tmp_path, "mistralai--Mixtral-8x7B-v0.1"), fsdp="2", wrap=wrap, **EXPERTS)
    (f,) = [f for f in result.findings if f.code == "FSDP303"]
    assert f"reads {read}" in f.message.split(" directly")[0] and "mixed torch.Tensor and DTensor" in f.message


def result_params(result):
    return [p for u in result.plan.units for p in u.params]
