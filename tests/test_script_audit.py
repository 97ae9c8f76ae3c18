"""`fsdplint train.py --model config.json`: the model audit run with the script's own settings."""

from __future__ import annotations

import json
import shutil
import textwrap

import libcst as cst
import pytest
from click.testing import CliRunner

from fsdplint.analysis import ScriptAnalysis
from fsdplint.cli import main
from fsdplint.audit.from_script import extract

SCRIPTS = "fixtures/scripts/script_model"
QWEN = "fixtures/models/qwen2_5_0_5b.json"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch, fixtures_dir):
    monkeypatch.chdir(fixtures_dir.parent)


def lint(*args):
    """(exit code, findings as json, stderr)."""
    r = CliRunner().invoke(main, ["check", "--isolated", "--output-format", "json", *map(str, args)])
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout), r.stderr


def row_of(path, needle) -> int:
    lines = open(path).read().splitlines()
    (row,) = [i + 1 for i, line in enumerate(lines) if needle in line]
    return row


def test_typo_target_is_reported_on_the_target_modules_line():
    script = f"{SCRIPTS}/fsdp2_lora_typo.py"
    code, findings, err = lint(script, "--model", QWEN)
    assert code == 1
    (f,) = [f for f in findings if f["code"] == "FSDP113"]
    assert f["location"]["row"] == row_of(script, "target_modules=")
    assert "'vproj'" in f["message"] and "v_proj" in f["message"]
    assert "[model audit of qwen2_5_0_5b.json, FSDP2 at world size 8 (assumed)]" in f["message"]
    assert "world size not fixed" in err


def test_without_model_the_audit_does_not_run():
    code, findings, _ = lint(f"{SCRIPTS}/fsdp2_lora_typo.py")
    assert not any("model audit" in f["message"] for f in findings)


@pytest.mark.parametrize("script", ["fsdp2_lora_correct.py", "fsdp1_lora_peft_policy_correct.py"])
def test_correct_scripts_pass(script):
    code, findings, _ = lint(f"{SCRIPTS}/{script}", "--model", QWEN)
    assert (code, findings) == (0, [])


def test_fsdp1_layer_policy_reports_torchs_error_once_at_the_wrap_call():
    script = f"{SCRIPTS}/fsdp1_lora_layer_policy_buggy.py"
    code, findings, _ = lint(script, "--model", QWEN)
    assert code == 1
    (f,) = [f for f in findings if f["code"] == "FSDP004"]  # the static finding is replaced, not repeated
    assert f["location"]["row"] == row_of(script, "model = FSDP(")
    assert "has both parameters with requires_grad=True and False" in f["message"]
    assert "23 more units" in f["message"] and "FSDP1 at world size 8" in f["message"]
    assert f["fix"] is not None  # the static rewrite (use_orig_params=True) is kept


def test_static_finding_is_not_repeated_at_another_line():
    code, findings, _ = lint(f"{SCRIPTS}/fsdp2_qlora_buggy.py", "--model", QWEN)
    assert code == 1
    assert [f["code"] for f in findings].count("FSDP201") == 1


def test_targets_outside_the_decoder_layers_without_fsdp():
    script = f"{SCRIPTS}/lora_only_head.py"
    code, findings, err = lint(script, "--model", QWEN)
    assert code == 1
    (f,) = findings
    assert f["code"] == "FSDP113" and f["message"].startswith("possibly unintended")
    assert f["location"]["row"] == row_of(script, "target_modules=TARGETS")
    assert "24 decoder layers" in f["message"] and "q_proj" in f["message"]
    assert "does not use FSDP" in err


def test_targets_that_are_not_literals_are_not_guessed():
    code, findings, err = lint(f"{SCRIPTS}/lora_targets_from_args.py", "--model", QWEN)
    assert (code, findings) == (0, [])
    assert "target_modules not a literal" in err


def test_noqa_silences_an_audit_finding(tmp_path):
    src = open(f"{SCRIPTS}/fsdp2_lora_typo.py").read().replace(
        'target_modules=["q_proj", "vproj"],', 'target_modules=["q_proj", "vproj"],  # noqa: FSDP113')
    script = tmp_path / "train.py"
    script.write_text(src)
    code, findings, _ = lint(script, "--model", QWEN)
    assert (code, findings) == (0, [])  # and no "unused noqa" either


def test_world_size_and_version_come_from_the_accelerate_config(tmp_path):
    (tmp_path / "fsdp.yaml").write_text(textwrap.dedent("""\
        distributed_type: FSDP
        fsdp_config:
          fsdp_version: 2
          fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
        num_machines: 2
        num_processes: 16
        """))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        from accelerate import Accelerator
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        accelerator = Accelerator()
        model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "vproj"]))
        model = accelerator.prepare(model)
        """))
    code, findings, err = lint(script, "--model", QWEN)
    (f,) = [f for f in findings if f["code"] == "FSDP113"]
    assert "FSDP2 at world size 16]" in f["message"]
    assert "world size not fixed" not in err


def test_target_torch_comes_from_the_project(tmp_path):
    (tmp_path / "requirements.txt").write_text("torch==2.6.0\n")
    shutil.copy(f"{SCRIPTS}/fsdp2_lora_correct.py", tmp_path / "train.py")
    _, _, err = lint(tmp_path / "train.py", "--model", QWEN)
    assert "checks target torch 2.6.0 (requirements.txt: torch==2.6.0)" in err


def test_audit_spec_as_model_config(tmp_path, fixtures_dir):
    spec = tmp_path / "audit.json"
    spec.write_text(json.dumps({"model": str(fixtures_dir / "models" / "qwen2_5_0_5b.json"),
                                "fsdp": {"world_size": 4}}))
    code, findings, err = lint(f"{SCRIPTS}/fsdp2_lora_typo.py", "--model", spec)
    (f,) = [f for f in findings if f["code"] == "FSDP113"]
    assert "FSDP2 at world size 4]" in f["message"]  # the spec fixes what the script leaves open
    assert code == 1 and "world size not fixed" not in err


@pytest.mark.parametrize("name,content,needle", [
    ("broken.json", "{not json", "broken.json:1:2: invalid JSON"),
    ("missing.json", None, "missing.json: model config not found"),
    ("adapter.json", '{"r": 8}', "neither a Hugging Face config"),
])
def test_bad_model_config_is_one_line_and_exit_2(tmp_path, name, content, needle):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    r = CliRunner().invoke(main, ["check", "--isolated", f"{SCRIPTS}/fsdp2_lora_typo.py", "--model", str(path)])
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert err.startswith("fsdplint: error: ") and needle in err and "\n" not in err and "Traceback" not in err


def _settings(src: str):
    module = cst.parse_module(textwrap.dedent(src))
    return extract(ScriptAnalysis(module), module=module, text=module.code)


def test_extract_reads_literals_through_names():
    s = _settings("""\
        import torch
        from peft import LoraConfig, TaskType, get_peft_model
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        DTYPE = torch.bfloat16
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=DTYPE)
        model = AutoModelForCausalLM.from_pretrained(name, quantization_config=bnb, torch_dtype=DTYPE)
        cfg = LoraConfig(r=8, target_modules=("q_proj", "v_proj"), task_type=TaskType.CAUSAL_LM)
        model = get_peft_model(model, cfg, autocast_adapter_dtype=False)
        model = FSDP(model, use_orig_params=True)
        """)
    assert s.lora == {"r": 8, "target_modules": ["q_proj", "v_proj"], "task_type": "CAUSAL_LM"}
    assert s.quantization == {"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"}
    assert s.dtype == "bfloat16" and s.autocast_adapter_dtype is False
    assert s.fsdp == {"version": 1, "use_orig_params": True, "auto_wrap_policy": "none"}
    assert s.world_size_assumed
    assert s.locations["lora.target_modules"][0] == 8 and s.locations["fsdp.use_orig_params"][0] == 10
    assert s.locations["quantization"][0] == 6 and not s.skip


def test_extract_leaves_out_checks_that_depend_on_runtime_values():
    s = _settings("""\
        import torch
        from peft import LoraConfig, get_peft_model
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = get_peft_model(model, LoraConfig(target_modules=args.targets))
        model = FSDP(model, auto_wrap_policy=make_policy(model), use_orig_params=flag)
        """)
    assert {"FSDP113", "FSDP004"} <= s.skip
    assert any("auto_wrap_policy" in n for n in s.notes)
