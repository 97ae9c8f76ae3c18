"""`-v` / `--show-settings`: what each file's findings rest on (root, launches, configs, versions)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main

SCRIPT = """\
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

model = get_peft_model(AutoModelForCausalLM.from_pretrained("m"), LoraConfig(r=8))
model = Accelerator().prepare(model)
"""


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    files = {
        "pyproject.toml": '[project]\nname = "demo"\ndependencies = ["torch>=2.5", "peft>=0.13"]\n',
        "jobs/fsdp.yaml": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n",
        "jobs/run.sh": "cd ..\naccelerate launch --config_file jobs/fsdp.yaml train.py\n",
        "train.py": SCRIPT,
        "other/train.py": SCRIPT,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


def test_show_settings_prints_root_launches_configs_and_versions_and_lints_nothing(tmp_path, monkeypatch):
    root = _project(tmp_path)
    monkeypatch.chdir(root)
    r = CliRunner().invoke(main, ["check", "--isolated", "--show-settings", "--target-version", "transformers=5.0",
                                  "train.py", "other/train.py"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    mine, other = r.stdout.split("other/train.py:\n")
    assert mine.startswith("train.py:\n")
    assert f"project root: {root.resolve()} (nearest directory with" in mine
    assert "jobs/run.sh:2: accelerate train.py (found in the project's shell scripts)" in mine
    assert "fsdp.yaml (named by the launch at jobs/run.sh:2)" in mine
    assert "torch 2.5 (pyproject.toml: torch>=2.5)" in mine and "peft 0.13 (pyproject.toml: peft>=0.13)" in mine
    assert "transformers 5.0 (--target-version)" in mine
    # The other folder's script is not launched by jobs/run.sh and reads no config.
    assert "launches: none" in other and "launch configs read: none" in other


def test_verbose_explains_on_stderr_and_still_reports(tmp_path, monkeypatch):
    root = _project(tmp_path)
    monkeypatch.chdir(root)
    r = CliRunner().invoke(main, ["check", "--isolated", "-v", "--exit-zero", "train.py"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "train.py:\n  project root:" in r.stderr and "library versions:" in r.stderr
    assert "project root:" not in r.stdout
