"""The audit's numbers against the real libraries: peft's trainable count, DTensor shards."""

from __future__ import annotations

import pytest

from fsdplint.audit import audit_from_dicts, load_spec, run_audit, spec_from_dict
from fsdplint.audit.examples import spec, tiny


def _local_bytes(model):
    from torch.distributed.tensor import DTensor

    return sum(p.to_local().numel() * p.element_size() for p in model.parameters() if isinstance(p, DTensor))


@pytest.mark.parametrize("fixture,targets,world", [
    ("llama3_8b.json", "q_proj,v_proj", 8),
    ("qwen2_5_0_5b.json", "q_proj,k_proj,v_proj,o_proj", 32),
    ("mixtral_8x7b.json", "q_proj,v_proj", 16),
])
def test_param_bytes_per_rank_equal_the_real_dtensor_shards(fixtures_dir, fixture, targets, world):
    s = load_spec(fixtures_dir / "models" / fixture, {"target_modules": targets, "world_size": world})
    result = run_audit(s)
    from torch.distributed.tensor import DTensor

    assert all(isinstance(p, DTensor) for p in result.model.parameters())
    real = _local_bytes(result.model)
    assert result.memory.dtensor_local_bytes_rank0 == real
    # The estimate reports the worst rank; rank 0 holds the largest (first) chunks.
    assert result.memory.rank == 0
    assert result.memory.line("sharded parameters").bytes == real
    assert result.summary["trainable_params"] == result.summary["peft_trainable_params"]


def test_trainable_params_match_peft_and_the_model(fixtures_dir):
    result = run_audit(load_spec(fixtures_dir / "models" / "llama3_8b_lora_fsdp2.json"))
    # 32 layers x (q: 16*(4096+4096) + v: 16*(4096+1024))
    assert result.summary["trainable_params"] == 32 * (16 * 8192 + 16 * 5120) == 6_815_744
    assert result.summary["peft_trainable_params"] == 6_815_744
    assert result.summary["params"] == 8_030_261_248 + 6_815_744
    mem = result.memory
    trainable_bytes = 6_815_744 * 4  # LoRA weights are float32 (peft autocasts adapters)
    assert mem.line("gradients").bytes == pytest.approx(trainable_bytes / 8, rel=0.01)
    assert mem.line("AdamW state").bytes == pytest.approx(2 * trainable_bytes / 8, rel=0.01)


def test_uneven_shards_follow_torch_chunk():
    # r=16 LoRA A at world size 32: rank 31 gets no rows of lora_A; counts stay exact.
    result = run_audit(spec_from_dict(spec(lora={"r": 16, "target_modules": ["q_proj"]},
                                           fsdp={"world_size": 32}), filename="x.json"))
    assert result.memory.dtensor_local_bytes_rank0 == _local_bytes(result.model)
    per_rank = [sum(u.local_param_bytes[r] for u in result.plan.units) for r in range(32)]
    assert per_rank[0] == result.memory.dtensor_local_bytes_rank0
    assert sum(per_rank) == sum(p.numel * p.dtype.itemsize for p in
                                [q for u in result.plan.units for q in u.params])


def test_fsdp1_flat_params_cover_every_param_once():
    result = run_audit(spec_from_dict(spec(fsdp={"version": 1, "auto_wrap_policy": "peft", "world_size": 4}),
                                      filename="x.json"))
    # Executed: FullyShardedDataParallel's real flat parameters matched the computed units.
    assert result.plan.executed and result.plan.mismatch is None
    seen = [id(p) for u in result.plan.units for p in u.params]
    assert len(seen) == len(set(seen)) == sum(1 for _ in result.model.parameters())
    # peft's policy puts each LoRA leaf in its own unit: no unit mixes frozen and trainable.
    assert all(len({p.requires_grad for p in u.params}) <= 1 for u in result.plan.units)


def test_qlora_on_meta_has_params4bit_with_the_storage_dtype():
    result = run_audit(spec_from_dict(spec(quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"},
                                           fsdp={"ignored_params": "4bit"}), filename="x.json"))
    quant = [p for p in result.plan.ignored]
    assert quant and all(p.kind == "4bit" for p in quant)
    assert {str(p.storage_dtype) for p in quant} == {"torch.bfloat16"}
    assert all(p.storage_numel * 2 * 2 == p.numel for p in quant)  # 4 bits each, 2 bytes per element
    assert result.memory.line("unsharded parameters").bytes == sum(p.storage_bytes for p in quant)


def test_api_from_plain_dicts_reports_at_given_lines():
    result = audit_from_dicts(tiny("llama"), lora={"r": 8, "target_modules": ["q_proj", "vproj"]},
                              fsdp={"version": 2, "world_size": 2}, filename="train.py",
                              locations={"lora.target_modules": (12, 5)})
    (f,) = [f for f in result.findings if f.code == "FSDP113"]
    assert (f.filename, f.start.row, f.start.column) == ("train.py", 12, 5)


def test_hf_config_with_quantization_config_is_quantized(tmp_path):
    import json

    cfg = dict(tiny("llama"), quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True,
                                                   "_load_in_4bit": True, "bnb_4bit_quant_storage": "uint8"})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    result = run_audit(load_spec(path))
    assert result.summary["quantization"] == "4bit"
    assert "FSDP201" in {f.code for f in result.findings}


def test_custom_factory_parameterlist_experts(fixtures_dir):
    result = run_audit(load_spec(fixtures_dir / "models" / "custom_moe_spec.json"))
    (f,) = [f for f in result.findings if f.code == "FSDP301"]
    assert "ParameterList" in f.message and "target_parameters" in f.message
    assert result.summary["architecture"] == "custom_moe:build"
