"""Launch commands in a job YAML's `run: |` block (SkyPilot task files): the scripts they run are linted
under them, as under a shell script's launch."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main
from fsdplint.launch.docs import job_run_text

TARGETS = ["--target-version", "torch=2.6", "--target-version", "peft=0.21.2",
           "--target-version", "transformers=5.24.0", "--target-version", "accelerate=1.15.0"]

SCRIPT = """\
import argparse
from transformers import AutoModelForCausalLM
from peft import prepare_model_for_kbit_training
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

p = argparse.ArgumentParser()
p.add_argument("--qlora", type=str, default="false")
args = p.parse_args()
model = AutoModelForCausalLM.from_pretrained("gpt2")
if args.qlora == "true":
    model = prepare_model_for_kbit_training(model)
model = FSDP(model, use_orig_params=True)
"""

SKY = """\
resources:
  accelerators: A100:8
setup: |
  pip install -r requirements.txt
run: |
  set -e
  torchrun --nproc_per_node 8 \\
      train.py --qlora {value}
"""


def _lint(tmp: Path, files: dict) -> list[tuple[str, str]]:
    (tmp / "pyproject.toml").write_text("[project]\nname = 'job'\n")
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(text)
    r = CliRunner().invoke(main, ["check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                                  *TARGETS, str(tmp / "train.py")])
    assert r.exit_code == 0, r.output
    return [(f["code"], f["severity"]) for f in json.loads(r.stdout) if f["code"] == "FSDP104"]


def test_run_block_keeps_its_lines_and_blanks_the_rest():
    text = SKY.format(value="true")
    out = job_run_text(text)
    lines, kept = text.splitlines(), out.splitlines()
    assert len(kept) == len(lines)
    assert kept[6].startswith("torchrun --nproc_per_node 8") and kept[7] == "    train.py --qlora true"
    assert kept[2] == "" and "pip install" not in out  # the setup block is not the job's launch


def test_yaml_without_a_launching_run_block_is_no_launcher():
    assert job_run_text("run: |\n  echo hello\n") == ""
    assert job_run_text("model:\n  run: |\n    torchrun train.py\n") == ""  # not the top-level key


def test_script_is_linted_under_the_job_yaml_launch(tmp_path):
    assert _lint(tmp_path, {"train.py": SCRIPT, "jobs/sky.yaml": SKY.format(value="true")}) == [("FSDP104", "error")]


def test_job_yaml_launch_that_leaves_the_branch_off(tmp_path):
    assert _lint(tmp_path, {"train.py": SCRIPT, "jobs/sky.yaml": SKY.format(value="false")}) == []
