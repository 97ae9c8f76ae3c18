"""FSDP1 plans that torch would refuse more than once: every failure, in torch's order, each with its cause.

Real peft/transformers/bitsandbytes models on the meta device (tiny Llama / DeepSeek-V3 configs).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fsdplint.audit import run_audit, spec_from_dict
from fsdplint.audit.cli import model_command
from fsdplint.audit.examples import spec

QLORA_UINT8 = {"load_in_4bit": True, "bnb_4bit_compute_dtype": "bfloat16"}
QLORA_BF16 = dict(QLORA_UINT8, bnb_4bit_quant_storage="bfloat16")


def errors(example):
    result = run_audit(spec_from_dict(example, filename="spec.json"))
    return [f for f in result.findings if f.severity.value == "error"]


def test_qlora_fsdp1_default_policy_reports_the_three_failures_in_torch_order():
    found = errors(spec(quantization=QLORA_UINT8, fsdp={"version": 1}))
    assert [f.code for f in found] == ["FSDP004", "FSDP202", "FSDP005"]
    frozen, storage, adapters = (f.message for f in found)
    # torch's own frozen-params check comes first (_validate_frozen_params)...
    assert frozen.startswith("FSDP1 would raise ValueError:") and "requires_grad=True and False" in frozen
    # ... then the flattening of each unit, found past the earlier failures.
    assert storage.startswith("With FSDP004 fixed, FSDP1 would next raise ValueError:")
    assert "Cannot flatten integer dtype tensors" in storage and "set bnb_4bit_quant_storage=bfloat16" in storage
    assert adapters.startswith("With FSDP004 and FSDP202 fixed, FSDP1 would next raise ValueError:")
    assert "bfloat16 and torch.float32" in adapters and "autocast_adapter_dtype=False" in adapters


def test_bf16_storage_with_peft_fp32_adapters_is_not_blamed_on_the_storage():
    found = errors(spec(quantization=QLORA_BF16, fsdp={"version": 1, "use_orig_params": True}))
    assert [f.code for f in found] == ["FSDP005"], [(f.code, f.message) for f in found]
    msg = found[0].message
    assert "bnb_4bit_quant_storage" not in msg
    assert "LoRA adapters" in msg and "autocast_adapter_dtype=True, the default" in msg


def test_autocast_adapter_dtype_false_builds_the_plan():
    lora = {"r": 8, "target_modules": ["q_proj", "v_proj"], "autocast_adapter_dtype": False}
    assert errors(spec(lora=lora, quantization=QLORA_BF16, fsdp={"version": 1, "use_orig_params": True})) == []


def test_float32_compute_dtype_is_named_as_the_adapters_dtype_source():
    # BitsAndBytesConfig's default compute dtype is float32: peft creates 4-bit layers' adapters in it.
    lora = {"r": 8, "target_modules": ["q_proj", "v_proj"], "autocast_adapter_dtype": False}
    found = errors(spec(lora=lora, quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"},
                        fsdp={"version": 1, "use_orig_params": True}))
    assert [f.code for f in found] == ["FSDP005"]
    assert "bnb_4bit_compute_dtype=bfloat16" in found[0].message


def test_peft_policy_plan_has_only_the_storage_failure():
    # peft's policy puts the fp32 LoRA leaves in units of their own: only the uint8 storage remains.
    found = errors(spec(quantization=QLORA_UINT8, fsdp={"version": 1, "auto_wrap_policy": "peft"}))
    assert [f.code for f in found] == ["FSDP202"]
    assert found[0].message.startswith("FSDP1 would raise ValueError:")


def test_weights_transformers_keeps_in_fp32_get_their_own_cause():
    found = errors(spec("deepseek_v3", lora={"r": 8, "target_modules": ["q_b_proj", "kv_b_proj"]},
                        fsdp={"version": 1, "use_orig_params": True}))
    kept = [f for f in found if "_keep_in_fp32_modules" in f.message]
    assert kept and kept[0].code == "FSDP005" and "mlp.gate.weight" in kept[0].message


def test_cli_lists_every_failure_and_the_flag_for_peft_autocast(tmp_path):
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(spec(quantization=QLORA_UINT8, fsdp={"version": 1})))
    r = CliRunner().invoke(model_command, [str(p), "--output-format", "json"])
    assert r.exit_code == 1
    codes = [f["code"] for f in json.loads(r.stdout)["findings"] if f["code"] != "FSDP502"]
    assert codes == ["FSDP004", "FSDP202", "FSDP005"]
    r = CliRunner().invoke(model_command, [str(p), "--quant-storage", "bfloat16", "--use-orig-params",
                                           "--no-autocast-adapter-dtype", "--output-format", "json"])
    assert r.exit_code in (0, 1), r.output
    assert [f["code"] for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"] == []


@pytest.mark.parametrize("use_orig", [False, True])
def test_plain_lora_on_bf16_fsdp1_reports_the_adapter_upcast_only_past_fsdp004(use_orig):
    found = errors(spec(fsdp={"version": 1, "use_orig_params": use_orig}))
    codes = [f.code for f in found]
    assert codes == (["FSDP005"] if use_orig else ["FSDP004", "FSDP005"])
