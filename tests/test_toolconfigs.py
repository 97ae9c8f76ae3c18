"""axolotl / LLaMA-Factory configs as lint inputs (fixtures/toolconfigs), launcher-named accelerate configs,
and `fsdplint model` on a tool config, all through the real CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main
from fsdplint.launch.tools.launchers import accelerate_configs_named_by
from fsdplint.launch.tools.read import recognise

ROOT = Path(__file__).resolve().parent.parent
TC = ROOT / "fixtures" / "toolconfigs"
AX = TC / "axolotl"
LF = TC / "llamafactory"


def lint(*args: str):
    """(exit code, findings as dicts) of `fsdplint ARGS --output-format json`."""
    result = CliRunner().invoke(main, [*args, "--output-format", "json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def codes(findings) -> list[tuple[str, str, int]]:
    return sorted((f["code"], f["severity"], f["location"]["row"]) for f in findings)


def copy(tmp_path: Path, src: Path, name: str | None = None, requirements: str | None = None) -> Path:
    """`src` in a fresh directory (so the versions come from its own requirements.txt, if any)."""
    d = tmp_path / "job"
    d.mkdir(exist_ok=True)
    (d / ".git").mkdir(exist_ok=True)  # the project ends here: no requirements from above
    dst = d / (name or src.name)
    shutil.copy(src, dst)
    if requirements is not None:
        (d / "requirements.txt").write_text(requirements)
    return dst


# -- recognition by content ------------------------------------------------------------------------
def test_tool_configs_are_recognised_by_content_not_name(tmp_path):
    renamed = copy(tmp_path, AX / "lora_8bit_fsdp_buggy.yml", "anything.yml")
    assert recognise(renamed.read_text(), str(renamed)) == "axolotl"
    lf = LF / "qlora_old_libs" / "examples" / "train" / "llama2_qlora_sft.yaml"
    assert recognise(lf.read_text(), str(lf)) == "llamafactory"
    for other in ("accelerate_fsdp.yaml", "model_card.yaml", "recipe.yaml"):
        p = TC / "other" / other
        assert recognise(p.read_text(), str(p)) is None, other


def test_renamed_axolotl_config_is_linted_as_one(tmp_path):
    renamed = copy(tmp_path, AX / "lora_8bit_fsdp_buggy.yml", "anything.yml")
    rc, findings = lint(str(renamed))
    assert rc == 1 and codes(findings) == [("FSDP203", "error", 5)]


def test_accelerate_and_other_yaml_are_not_mistaken_for_tool_configs():
    rc, findings = lint("--isolated", str(TC / "other" / "model_card.yaml"), str(TC / "other" / "recipe.yaml"))
    assert (rc, findings) == (0, [])
    # An accelerate config is still linted as one (its own rules), not as a job.
    rc, findings = lint("--isolated", str(TC / "other" / "accelerate_fsdp.yaml"))
    assert all(not f["message"].startswith(("axolotl", "LLaMA-Factory")) for f in findings)


# -- each mapped check, buggy and fixed, by tool version -----------------------------------------------
@pytest.mark.parametrize("requirements,expected", [
    (None, [("FSDP202", "warning", 7)]),  # axolotl version unknown: a warning that says what to declare
    ("axolotl==0.12.0\n", [("FSDP202", "error", 7)]),  # passes load_in_4bit through: uint8 storage
    ("axolotl==0.13.0\n", []),  # builds no 4-bit config for `adapter: lora`
])
def test_lora_on_4bit_base_under_fsdp1(tmp_path, requirements, expected):
    job = copy(tmp_path, AX / "lora_4bit_fsdp1_buggy.yml", requirements=requirements)
    rc, findings = lint(str(job))
    assert codes(findings) == expected
    if expected and expected[0][1] == "warning":
        assert "declare the axolotl version" in findings[0]["message"]
        assert "adapter: qlora" in findings[0]["message"]


def test_qlora_under_fsdp1_is_left_to_axolotl():
    assert lint("--isolated", str(AX / "qlora_fsdp1_correct.yml")) == (0, [])


def test_8bit_lora_under_fsdp1_and_its_4bit_twin():
    rc, findings = lint("--isolated", str(AX / "lora_8bit_fsdp_buggy.yml"))
    assert rc == 1 and codes(findings) == [("FSDP203", "error", 5)]
    assert "FSDP1 (axolotl's default fsdp_version is 1)" in findings[0]["message"]
    assert lint("--isolated", str(AX / "qlora_fsdp_correct.yml")) == (0, [])


@pytest.mark.parametrize("version,expected", [
    (None, [("FSDP201", "warning", 5)]),
    ("0.11.0", [("FSDP201", "warning", 5)]),  # before axolotl's FSDP2 Params4bit patch: a warning (not measured to fail)
    ("0.12.0", []),
])
def test_qlora_under_fsdp2_by_axolotl_version(version, expected):
    args = ["--isolated", str(AX / "qlora_fsdp2.yml")] + (["--target-version", f"axolotl={version}"] if version else [])
    assert codes(lint(*args)[1]) == expected


def test_8bit_under_fsdp2_handled_from_axolotl_0_15(tmp_path):
    job = tmp_path / "fsdp2_8bit.yml"
    job.write_text((AX / "lora_8bit_fsdp_buggy.yml").read_text().replace("fsdp:\n  - full_shard\n  - auto_wrap\n",
                                                                          "fsdp_version: 2\n"))
    assert codes(lint("--isolated", str(job), "--target-version", "axolotl=0.14.0")[1]) == [("FSDP203", "error", 5)]
    assert lint("--isolated", str(job), "--target-version", "axolotl=0.15.0") == (0, [])


def test_lora_targets_against_the_architecture():
    rc, findings = lint("--isolated", str(AX / "lora_targets_buggy.yml"))
    assert codes(findings) == [("FSDP113", "error", 5)]
    assert "'vproj'" in findings[0]["message"] and "v_proj" in findings[0]["message"]
    assert lint("--isolated", str(AX / "lora_targets_correct.yml")) == (0, [])
    # An architecture fsdplint cannot tell: silent.
    assert lint("--isolated", str(AX / "lora_targets_unknown_arch.yml")) == (0, [])


def test_lora_targets_from_a_local_model_config(tmp_path):
    model = tmp_path / "job" / "my-model"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    job = copy(tmp_path, AX / "lora_targets_correct.yml")
    job.write_text(job.read_text().replace("base_model: NousResearch/Meta-Llama-3-8B", "base_model: ./my-model")
                   .replace("model_type: LlamaForCausalLM", "model_type: AutoModelForCausalLM"))
    rc, findings = lint(str(job))
    assert [f["code"] for f in findings] == ["FSDP113"] and "gpt2" in findings[0]["message"]


@pytest.mark.parametrize("version,expected", [
    (None, [("FSDP009", "warning", 6)]),
    ("0.11.0", [("FSDP009", "error", 6)]),
    ("0.12.0", []),  # axolotl drops device_map under FSDP itself
])
def test_device_map_under_fsdp(version, expected):
    args = ["--isolated", str(AX / "device_map_fsdp.yml")] + (["--target-version", f"axolotl={version}"] if version else [])
    assert codes(lint(*args)[1]) == expected


def test_llamafactory_8bit_under_fsdp():
    job = str(LF / "lora_8bit_fsdp.yaml")
    # TrainingArguments' fsdp keys in the YAML; FSDP1 before transformers 5.10, FSDP2 after.
    rc, findings = lint("--isolated", job, "--target-version", "transformers=4.57.1")
    assert codes(findings) == [("FSDP203", "warning", 2)]
    assert "FSDP1" in findings[0]["message"] and "LLaMA-Factory" in findings[0]["message"]
    rc, findings = lint("--isolated", job, "--target-version", "transformers=5.24.0")
    assert "FSDP2" in findings[0]["message"]
    # LLaMA-Factory >= 0.7.1 refuses 8-bit under FSDP itself (read at v0.7.0 and v0.7.1; the message names
    # fsdp+qlora from 0.8.2). (transformers pinned too: with FSDP2 the job would also meet LLaMA-Factory's own
    # FSDP2 advisory, FSDP601)
    tf = ("--target-version", "transformers=4.57.1")
    assert lint("--isolated", job, "--target-version", "llamafactory=0.8.2", *tf) == (0, [])
    assert lint("--isolated", job, "--target-version", "llamafactory=0.7.1", *tf) == (0, [])
    assert codes(lint("--isolated", job, "--target-version", "llamafactory=0.7.0", *tf)[1]) == [("FSDP203", "error", 2)]
    assert lint("--isolated", str(LF / "qlora_fsdp_correct.yaml"), "--target-version", "transformers=4.57.1") == (0, [])


def _lf_project(tmp_path: Path, requirements: str, launcher: bool = True) -> Path:
    d = tmp_path / "lf"
    shutil.copytree(LF / "qlora_old_libs", d)
    (d / ".git").mkdir()
    (d / "requirements.txt").write_text(requirements)
    if not launcher:
        (d / "run_qlora.sh").unlink()
    return d


@pytest.mark.parametrize("requirements,expected", [
    ("transformers==4.38.2\nbitsandbytes==0.42.0\n", [("FSDP202", "warning", 3)]),
    ("transformers==4.38.2\nbitsandbytes==0.42.0\nllamafactory==0.7.0\n", [("FSDP202", "error", 3)]),
    # From 0.7.1 (read at v0.7.0 and v0.7.1) it refuses old versions under FSDP itself.
    ("transformers==4.38.2\nbitsandbytes==0.42.0\nllamafactory==0.7.1\n", []),
    ("transformers==4.38.2\nbitsandbytes==0.42.0\nllamafactory==0.8.0\n", []),
    ("transformers==4.39.1\nbitsandbytes==0.43.0\n", []),  # the storage keyword is honoured
])
def test_llamafactory_qlora_with_the_environment_pins(tmp_path, monkeypatch, requirements, expected):
    d = _lf_project(tmp_path, requirements)
    monkeypatch.chdir(d)
    rc, findings = lint(".")
    # (the Trainer's own known bugs at these old transformers pins are FSDP601's, checked elsewhere)
    findings = [f for f in findings if f["code"] != "FSDP601"]
    assert codes(findings) == expected
    if expected:
        assert findings[0]["filename"] == "examples/train/llama2_qlora_sft.yaml"
        assert "examples/accelerate/fsdp_config.yaml" in findings[0]["message"]  # FSDP through the launcher


def test_llamafactory_job_without_fsdp_is_silent(tmp_path, monkeypatch):
    d = _lf_project(tmp_path, "transformers==4.38.2\nbitsandbytes==0.42.0\n", launcher=False)
    monkeypatch.chdir(d)
    assert lint(".") == (0, [])


# -- where findings point, in every format -------------------------------------------------------------
def test_findings_point_at_the_yaml_line_in_text_json_and_sarif():
    job = str(AX / "lora_8bit_fsdp_buggy.yml")
    _, findings = lint("--isolated", job)
    assert findings[0]["location"] == {"row": 5, "column": 1} and findings[0]["filename"].endswith("lora_8bit_fsdp_buggy.yml")
    full = CliRunner().invoke(main, ["--isolated", job, "--output-format", "full"]).stdout
    assert "lora_8bit_fsdp_buggy.yml:5:1: FSDP203" in full and "load_in_8bit: true" in full
    sarif = json.loads(CliRunner().invoke(main, ["--isolated", job, "--output-format", "sarif"]).stdout)
    loc = sarif["runs"][0]["results"][0]["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"].endswith("lora_8bit_fsdp_buggy.yml") and loc["region"]["startLine"] == 5


def test_noqa_on_the_yaml_line(tmp_path):
    job = tmp_path / "cfg.yml"
    text = (AX / "lora_8bit_fsdp_buggy.yml").read_text()
    job.write_text(text.replace("load_in_8bit: true", "load_in_8bit: true  # noqa: FSDP203"))
    assert lint("--isolated", str(job)) == (0, [])
    job.write_text(text.replace("load_in_8bit: true", "load_in_8bit: true  # noqa: FSDP202"))
    assert [f["code"] for f in lint("--isolated", str(job))[1]] == ["FSDP203"]


# -- discovery -------------------------------------------------------------------------------------------
def test_a_project_of_only_an_axolotl_config_and_a_launcher_is_linted(tmp_path, monkeypatch):
    shutil.copytree(TC / "axolotl_project", tmp_path / "p")
    monkeypatch.chdir(tmp_path / "p")
    rc, findings = lint(".")
    assert rc == 1 and [(f["filename"], f["code"]) for f in findings] == [("finetune.yml", "FSDP203")]


def test_other_yaml_in_a_directory_is_not_linted(tmp_path):
    shutil.copytree(TC / "other", tmp_path / "o")
    result = CliRunner().invoke(main, ["--isolated", str(tmp_path / "o"), "--output-format", "json", "--statistics"])
    assert result.exit_code == 0, result.output


LOADS_8BIT = (
    "from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
    "model = AutoModelForCausalLM.from_pretrained('m', quantization_config=BitsAndBytesConfig(load_in_8bit=True))\n"
)
ACCELERATE_FSDP1 = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\nnum_processes: 4\n"


@pytest.mark.parametrize("launcher", [True, False])
def test_accelerate_config_under_configs_found_through_the_launcher(tmp_path, monkeypatch, launcher):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "fsdp.yaml").write_text(ACCELERATE_FSDP1)
    (tmp_path / "train.py").write_text(LOADS_8BIT)
    if launcher:
        (tmp_path / "launch.sh").write_text("accelerate launch \\\n  --config_file configs/fsdp.yaml \\\n  train.py\n")
    monkeypatch.chdir(tmp_path)
    rc, findings = lint("--isolated", ".")
    assert [f["code"] for f in findings] == (["FSDP203"] if launcher else [])
    assert accelerate_configs_named_by(tmp_path) == ([Path("configs/fsdp.yaml")] if launcher else [])


# -- fsdplint model on a tool config ------------------------------------------------------------------------
TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
              "vocab_size": 256, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def _model(*args):
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    return CliRunner().invoke(main, ["model", *args, "--output-format", "json"])


def test_model_command_takes_an_axolotl_config(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(TINY_LLAMA))
    job = copy(tmp_path, AX / "lora_4bit_fsdp1_buggy.yml")
    job.write_text(job.read_text().replace("lora_target_linear: true", "lora_target_modules: [q_proj, v_proj]"))
    result = _model(str(job), "--config-json", str(cfg))
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    found = [(f["code"], f["location"]["row"]) for f in report["findings"]]
    assert ("FSDP202", 7) in found, found  # the real meta-device build: uint8 storage cannot be flattened
    twin = copy(tmp_path, AX / "qlora_fsdp1_correct.yml")
    result = _model(str(twin), "--config-json", str(cfg))
    assert result.exit_code == 0, result.output


def test_model_command_needs_a_weights_free_config_for_a_hub_id(tmp_path):
    result = CliRunner().invoke(main, ["model", str(AX / "qlora_fsdp1_correct.yml")])
    assert result.exit_code == 2
    assert "qlora_fsdp1_correct.yml:2:" in result.output and "--config-json" in result.output


@pytest.mark.parametrize("pin,expected", [
    ("", [("FSDP202", "warning", 13)]),
    ("llamafactory==0.7.0\n", [("FSDP202", "error", 13)]),
    ("llamafactory==0.7.1\n", []),
    ("llamafactory==0.8.0\n", []),
])
def test_llamafactory_job_given_as_launcher_flags(tmp_path, monkeypatch, pin, expected):
    d = tmp_path / "flags"
    shutil.copytree(LF / "flags_project", d)
    (d / ".git").mkdir()
    (d / "requirements.txt").write_text((d / "requirements.txt").read_text() + pin)
    monkeypatch.chdir(d)
    rc, findings = lint(".")
    assert codes(findings) == expected
    if expected:
        assert findings[0]["filename"] == "scripts/qlora_sft.sh"
        assert "--quantization_bit 4" in CliRunner().invoke(main, [".", "--output-format", "full"]).stdout


def test_model_command_takes_a_trl_recipe_launched_with_an_fsdp1_config(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(TINY_LLAMA))
    d = tmp_path / "proj"
    d.mkdir()
    recipe = d / "config_qlora.yaml"
    recipe.write_text((TC / "other" / "recipe.yaml").read_text().replace("dataset_mixer:", "output_dir: out\ndataset_mixer:"))
    (d / "fsdp.yaml").write_text(ACCELERATE_FSDP1)
    (d / "launch.sh").write_text("accelerate launch --config_file fsdp.yaml run_sft.py config_qlora.yaml\n")
    result = _model(str(recipe), "--config-json", str(cfg))
    assert result.exit_code == 1, result.output
    found = [(f["code"], f["location"]["row"]) for f in json.loads(result.stdout)["findings"]]
    assert ("FSDP202", 4) in found, found  # load_in_4bit: trl passes bnb_4bit_quant_storage=None (uint8)
    recipe.write_text(recipe.read_text().replace("load_in_4bit: true", "load_in_4bit: true\nbnb_4bit_quant_storage: bfloat16"))
    result = _model(str(recipe), "--config-json", str(cfg))
    assert result.exit_code == 0, result.output


def test_linting_a_tool_config_imports_no_heavy_library():
    import subprocess
    import sys
    import textwrap

    probe = textwrap.dedent(f"""
        import sys
        from fsdplint.cli import main
        try:
            main(["--isolated", {str(AX / "lora_8bit_fsdp_buggy.yml")!r}, {str(LF / "flags_project")!r}])
        except SystemExit as e:
            code = e.code
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "peft", "transformers", "accelerate",
                                                                      "bitsandbytes", "rich"))
        print("HEAVY:", heavy)
        print("CODE:", code)
        """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "CODE: 1" in out and "HEAVY: []" in out, out


def test_axolotl_bfloat16_storage_with_fp16_training_is_a_warning(tmp_path):
    job = tmp_path / "fp16.yml"
    job.write_text((AX / "qlora_fsdp1_correct.yml").read_text().replace("bf16: auto", "fp16: true"))
    rc, findings = lint("--isolated", str(job))
    assert codes(findings) == [("FSDP202", "warning", 7)]
    assert "bfloat16" in findings[0]["message"] and "float16" in findings[0]["message"]


def test_model_command_reports_invalid_yaml_with_its_line(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("base_model: x\nadapter: qlora\n  oops: [\n")
    result = CliRunner().invoke(main, ["model", str(bad)])
    assert result.exit_code == 2 and "bad.yml:3: invalid YAML" in result.output


def test_llamafactory_qlora_without_a_precision_key_stores_the_inferred_compute_dtype(tmp_path):
    # With neither bf16, pure_bf16 nor fp16, LLaMA-Factory infers the compute dtype from the checkpoint (bfloat16
    # or float16) and gives it to the 4-bit weights as their storage: a float, never uint8.
    yaml = ("model_name_or_path: meta-llama/Llama-3.1-8B\nquantization_bit: 4\nstage: sft\nfinetuning_type: lora\n"
            "template: llama3\nfsdp: full_shard auto_wrap\nfsdp_config:\n  version: 1\n")
    new = "transformers==4.45.0\nbitsandbytes==0.44.0\nllamafactory==0.9.0\n"
    for name, text in (("no-key", yaml), ("bf16-false", yaml + "bf16: false\n"),
                       ("infer-dtype", yaml + "infer_dtype: float32\n")):  # infer_dtype is for inference only
        d = tmp_path / name
        d.mkdir()
        (d / ".git").mkdir()
        (d / "lf.yaml").write_text(text)
        (d / "requirements.txt").write_text(new)
        assert [f for f in lint("--isolated", str(d / "lf.yaml"))[1] if f["code"] == "FSDP202"] == [], name
    # Libraries that drop the storage keyword still leave uint8 storage (LLaMA-Factory 0.7.0 does not check).
    d = tmp_path / "old"
    d.mkdir()
    (d / ".git").mkdir()
    (d / "lf.yaml").write_text(yaml)
    (d / "requirements.txt").write_text("transformers==4.38.2\nbitsandbytes==0.42.0\nllamafactory==0.7.0\n")
    assert codes([f for f in lint("--isolated", str(d / "lf.yaml"))[1] if f["code"] == "FSDP202"]) == [
        ("FSDP202", "error", 2)]
