"""A framework default that changed between releases (the Trainer's use_orig_params from transformers 4.36, its
switch to peft's policy for a PEFT model from 4.39) decides a framework wrap; when nobody declares, pins, locks
or installs transformers, the job may run either side of the change: the finding is a warning that names the
release to declare, and a declared release (or a known library that requires one) decides it."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

from fsdplint.engine import Settings, lint_file

from test_framework_wrap import SFT_TREE, TRAINER_TREE


def _lint(root: Path, files: dict[str, str], script: str, code: str, peft: str = "0.10.0") -> list:
    # A fresh directory per tree: what a project declares is read once per directory and run.
    root = root / f"t{len(list(root.iterdir()))}"
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
    # Nothing installed counts: the job's transformers is what the project says, or unknown.
    s = dataclasses.replace(Settings(), use_installed=False, targets={"torch": "2.2.2", "peft": peft})
    return [f for f in lint_file(str(root / script), s).findings if f.code == code]


def test_trainer_fsdp_flags_without_a_transformers_release_warn_naming_it(tmp_path):
    found = _lint(tmp_path, TRAINER_TREE, "train_lora.py", "FSDP004")
    assert [f.severity.value for f in found] == ["warning"], found
    assert "declare transformers>=4.36.0 to decide" in found[0].message


def test_a_declared_release_decides_either_way(tmp_path):
    old = _lint(tmp_path, {**TRAINER_TREE, "requirements.txt": "transformers==4.35.2\n"}, "train_lora.py", "FSDP004")
    assert [f.severity.value for f in old] == ["error"], old
    assert not _lint(tmp_path, {**TRAINER_TREE, "requirements.txt": "transformers>=4.36\n"}, "train_lora.py", "FSDP004")


def test_an_accelerate_config_plan_names_the_policy_switch(tmp_path):
    found = _lint(tmp_path, SFT_TREE, "sft/train.py", "FSDP004")
    assert [f.severity.value for f in found] == ["warning"], found
    assert "declare transformers>=4.39.0 to decide" in found[0].message
    # A trl release that requires transformers >= 4.40 decides it: the Trainer gives a PEFT model peft's policy.
    assert not _lint(tmp_path, {**SFT_TREE, "requirements.txt": "trl>=0.11.0\n"}, "sft/train.py", "FSDP004")
    # An older trl (transformers >= 4.31) leaves it open.
    found = _lint(tmp_path, {**SFT_TREE, "requirements.txt": "trl==0.10.1\n"}, "sft/train.py", "FSDP004")
    assert [f.severity.value for f in found] == ["warning"] and "trl 0.10.1" in found[0].message, found


def test_a_half_precision_lora_model_under_the_trainers_fsdp_warns_for_fsdp005(tmp_path):
    script = TRAINER_TREE["train_lora.py"].replace(
        "from_pretrained(model_args.model_name_or_path)",
        "from_pretrained(model_args.model_name_or_path, torch_dtype=torch.bfloat16)").replace(
        "        import transformers\n", "        import torch\n        import transformers\n")
    files = {**TRAINER_TREE, "train_lora.py": script}
    # peft >= 0.12 keeps LoRA weights in float32 next to the bf16 base: one FlatParameter of two dtypes when the
    # Trainer keeps its auto_wrap policy (before transformers 4.39), separate units from 4.39.
    found = _lint(tmp_path, files, "train_lora.py", "FSDP005", peft="0.13.0")
    assert [f.severity.value for f in found] == ["warning"], found
    assert "declare transformers>=4.39.0 to decide" in found[0].message
    assert not _lint(tmp_path, {**files, "requirements.txt": "transformers>=4.39\n"}, "train_lora.py", "FSDP005",
                     peft="0.13.0")
