"""What the launched job's libraries do by release: accelerate's FSDP2 preparation and trl's 4-bit config.

Each test writes a small project (a script, the shell line that launches it, its requirement pins) and
runs the real CLI on it, as a user would: the versions come from the project's pins.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main

FSDP2_BY_ENV = """\
import os

from accelerate import Accelerator
from transformers import AutoModelForCausalLM


def configure():
    os.environ["ACCELERATE_USE_FSDP"] = "1"
    os.environ["FSDP_VERSION"] = "2"


def main():
    configure()
    accelerator = Accelerator()
    model = AutoModelForCausalLM.from_pretrained("org/model")
    model = accelerator.prepare(model)


main()
"""

TRL_QLORA = """\
from trl import ModelConfig, SFTConfig, SFTTrainer, TrlParser, get_quantization_config


def run(training_args, model_args):
    bnb = get_quantization_config(model_args)
    training_args.model_init_kwargs = {"quantization_config": bnb}
    SFTTrainer(model=model_args.model_name_or_path, args=training_args).train()


if __name__ == "__main__":
    training_args, model_args = TrlParser((SFTConfig, ModelConfig)).parse_args_and_config()
    run(training_args, model_args)
"""

FSDP2_YAML = """\
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_version: 2
num_processes: 4
"""


def _project(tmp_path: Path, script: str, launch: str, pins: str, extra: dict | None = None) -> Path:
    root = tmp_path / "job"
    root.mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'job'\n")
    (root / "requirements.txt").write_text(textwrap.dedent(pins))
    (root / "train.py").write_text(script)
    (root / "launch.sh").write_text("#!/bin/bash\n" + launch + "\n")
    for name, text in (extra or {}).items():
        (root / name).write_text(text)
    return root


def _findings(root: Path, code: str) -> list[dict]:
    r = CliRunner().invoke(main, ["check", str(root / "train.py"), "--exit-zero", "--no-cache",
                                  "--output-format", "json", "--select", code], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return [f for f in json.loads(r.stdout) if f["code"] == code]


def test_accelerate_that_always_passes_ignored_params_breaks_fsdp2_on_torch_2_6(tmp_path):
    root = _project(tmp_path, FSDP2_BY_ENV, "accelerate launch --use_fsdp train.py",
                    "torch==2.6.0\naccelerate==1.12.0\ntransformers==4.57.1\n")
    found = _findings(root, "FSDP001")
    assert len(found) == 1
    f = found[0]
    assert f["severity"] == "error"
    assert f["location"]["row"] == 9  # os.environ["FSDP_VERSION"] = "2": what makes accelerate use FSDP2
    assert "accelerate 1.12.0" in f["message"] and "TypeError" in f["message"]


def test_accelerate_1_13_passes_ignored_params_only_on_torch_2_7(tmp_path):
    root = _project(tmp_path, FSDP2_BY_ENV, "accelerate launch --use_fsdp train.py",
                    "torch==2.6.0\naccelerate==1.13.0\ntransformers==4.57.1\n")
    assert _findings(root, "FSDP001") == []


def test_the_same_accelerate_on_torch_2_7_is_fine(tmp_path):
    root = _project(tmp_path, FSDP2_BY_ENV, "accelerate launch --use_fsdp train.py",
                    "torch==2.7.1\naccelerate==1.12.0\ntransformers==4.57.1\n")
    assert _findings(root, "FSDP001") == []


def test_trl_4bit_config_from_the_command_line_under_fsdp2(tmp_path):
    # trl 0.24 takes the 4-bit storage from --dtype: bfloat16 storage is sharded by FSDP2 (accelerate
    # excludes only integer storage).
    root = _project(tmp_path, TRL_QLORA,
                    "accelerate launch --config_file fsdp2.yaml train.py --load_in_4bit --dtype bfloat16",
                    "torch==2.8.0\naccelerate==1.15.0\ntrl==0.24.0\ntransformers==4.57.1\n",
                    {"fsdp2.yaml": FSDP2_YAML})
    found = _findings(root, "FSDP201")
    assert len(found) == 1
    assert found[0]["location"]["row"] == 5  # the get_quantization_config(model_args) call
    assert "model_args.dtype (bfloat16)" in found[0]["message"]
    assert "launch.sh:2" in found[0]["message"]


def test_trl_from_0_26_keeps_uint8_storage_that_accelerate_excludes(tmp_path):
    root = _project(tmp_path, TRL_QLORA,
                    "accelerate launch --config_file fsdp2.yaml train.py --load_in_4bit --dtype bfloat16",
                    "torch==2.8.0\naccelerate==1.15.0\ntrl==0.26.0\ntransformers==4.57.1\n",
                    {"fsdp2.yaml": FSDP2_YAML})
    assert _findings(root, "FSDP201") == []


def test_trl_config_without_load_in_4bit_is_not_quantized(tmp_path):
    root = _project(tmp_path, TRL_QLORA, "accelerate launch --config_file fsdp2.yaml train.py --dtype bfloat16",
                    "torch==2.8.0\naccelerate==1.13.0\ntrl==0.24.0\ntransformers==4.57.1\n",
                    {"fsdp2.yaml": FSDP2_YAML})
    assert _findings(root, "FSDP201") == []


TRAINER_QLORA = """\
from dataclasses import dataclass

from transformers import AutoModelForCausalLM, BitsAndBytesConfig, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    model_name_or_path: str = "org/model"


model_args, training_args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
bnb = BitsAndBytesConfig(load_in_4bit=True)
model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, quantization_config=bnb)
Trainer(model=model, args=training_args).train()
"""
FSDP_FLAGS = 'torchrun --nproc_per_node 8 train.py --output_dir out --fsdp "full_shard auto_wrap"'


def test_fsdp_flag_means_fsdp1_before_transformers_5_10(tmp_path):
    # FSDP1 cannot flatten the default uint8 4-bit storage with the float weights (FSDP202).
    root = _project(tmp_path, TRAINER_QLORA, FSDP_FLAGS,
                    "torch==2.8.0\naccelerate==1.15.0\ntransformers==4.57.1\nbitsandbytes==0.48.2\n")
    assert [f["location"]["row"] for f in _findings(root, "FSDP202")] == [12]
    assert _findings(root, "FSDP201") == []


def test_fsdp_flag_means_fsdp2_from_transformers_5_10(tmp_path):
    # The same command line is FSDP2 on transformers 5.24: accelerate 1.13 shards the 4-bit weights (FSDP201),
    # and FSDP1's flattening rule no longer applies.
    root = _project(tmp_path, TRAINER_QLORA, FSDP_FLAGS,
                    "torch==2.8.0\naccelerate==1.13.0\ntransformers==5.24.0\nbitsandbytes==0.48.2\n")
    assert _findings(root, "FSDP202") == []
    assert [f["location"]["row"] for f in _findings(root, "FSDP201")] == [12]


PREPARE_ONLY = """\
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

accelerator = Accelerator()
model = AutoModelForCausalLM.from_pretrained("org/model")
model = accelerator.prepare(model)
"""


def test_fsdp2_switched_on_by_the_launchers_environment(tmp_path):
    # torchrun does not configure accelerate: the exported ACCELERATE_USE_FSDP and the FSDP_VERSION prefix do.
    launch = "export ACCELERATE_USE_FSDP=true\nFSDP_VERSION=2 torchrun --nproc_per_node 8 train.py"
    root = _project(tmp_path, PREPARE_ONLY, launch, "torch==2.6.0\naccelerate==1.11.0\n")
    (f,) = _findings(root, "FSDP001")
    assert Path(f["filename"]).name == "launch.sh" and f["location"]["row"] == 3


def test_environment_without_accelerate_use_fsdp_switches_nothing_on(tmp_path):
    root = _project(tmp_path, PREPARE_ONLY, "FSDP_VERSION=2 torchrun --nproc_per_node 8 train.py",
                    "torch==2.6.0\naccelerate==1.11.0\n")
    assert _findings(root, "FSDP001") == []


def test_accelerate_launch_config_replaces_the_exported_fsdp_settings(tmp_path):
    # accelerate launch writes FSDP_VERSION from its own config (here fsdp_version: 1) over the shell's.
    launch = "export ACCELERATE_USE_FSDP=1 FSDP_VERSION=2\naccelerate launch --config_file fsdp1.yaml train.py"
    yaml = FSDP2_YAML.replace("fsdp_version: 2", "fsdp_version: 1")
    root = _project(tmp_path, PREPARE_ONLY, launch, "torch==2.6.0\naccelerate==1.11.0\n", {"fsdp1.yaml": yaml})
    assert _findings(root, "FSDP001") == []
