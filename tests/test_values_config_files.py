"""A job's settings in a YAML/JSON file the launch names, read by the code as a config object: the file's
values (and the command line's `key=value` overrides) decide the script's branches. Probed with FSDP104
(prepare_model_for_kbit_training before an FSDP wrap), written the ways users write such jobs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main

TARGETS = ["--target-version", "torch=2.6", "--target-version", "peft=0.21.2",
           "--target-version", "transformers=5.24.0", "--target-version", "accelerate=1.15.0"]

YAML_DICT = """\
import argparse
import yaml
from transformers import AutoModelForCausalLM
from peft import prepare_model_for_kbit_training
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def build(cfg):
    model = AutoModelForCausalLM.from_pretrained(cfg["model"]["name"])
    if cfg["peft"]["q_lora"]:
        model = prepare_model_for_kbit_training(model)
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    args = p.parse_args()
    with open(args.config) as f:
        cfg = yaml.safe_load(f)
    model = FSDP(build(cfg), use_orig_params=True)


main()
"""

OMEGA_MAIN = """\
import argparse
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from builders import add_adapter


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("-c", "--config")
    args, rest = p.parse_known_args()
    return args.config, rest


def main():
    path, overrides = parse()
    cfg = OmegaConf.merge(OmegaConf.load(path), OmegaConf.from_dotlist(overrides))
    model = AutoModelForCausalLM.from_pretrained(cfg.model.name)
    model = add_adapter(model, cfg.peft)
    model = FSDP(model, use_orig_params=True)


main()
"""
OMEGA_BUILDERS = """\
from peft import prepare_model_for_kbit_training


def add_adapter(model, peft_params):
    if peft_params.q_lora:
        model = prepare_model_for_kbit_training(model)
    return model
"""

GET_DEFAULT = """\
import argparse
import json
from transformers import AutoModelForCausalLM
from peft import prepare_model_for_kbit_training
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

p = argparse.ArgumentParser()
p.add_argument("config")
args = p.parse_args()
cfg = json.load(open(args.config))
model = AutoModelForCausalLM.from_pretrained(cfg["model"])
if cfg.get("quantize", {default}):
    model = prepare_model_for_kbit_training(model)
model = FSDP(model, use_orig_params=True)
"""

DATACLASS = """\
import argparse
from transformers import AutoModelForCausalLM
from peft import prepare_model_for_kbit_training
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from myjob.config import JobConfig

p = argparse.ArgumentParser()
p.add_argument("--config")
args = p.parse_args()
config = JobConfig.from_yaml(args.config)
model = AutoModelForCausalLM.from_pretrained(config.model.name)
if config.peft.q_lora:
    model = prepare_model_for_kbit_training(model)
model = FSDP(model, use_orig_params=True)
"""


def lint(tmp: Path, files: dict, target: str = "train.py") -> list[tuple[str, str]]:
    """(code, severity) of each FSDP104 finding on `target`, linted with its project and launcher."""
    (tmp / "pyproject.toml").write_text("[project]\nname = 'job'\n")
    for name, text in files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(textwrap.dedent(text))
    r = CliRunner().invoke(main, ["check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                                  *TARGETS, str(tmp / target)])
    assert r.exit_code == 0, r.output
    return sorted((f["code"], f["severity"]) for f in json.loads(r.stdout) if f["code"] == "FSDP104")


def test_yaml_mapping_read_by_key_in_a_helper_decides_the_branch(tmp_path):
    files = {"train.py": YAML_DICT, "run.sh": "torchrun --nproc_per_node 8 train.py --config job.yaml\n",
             "job.yaml": "model:\n  name: meta-llama/Llama-3.1-8B\npeft:\n  q_lora: true\n"}
    assert lint(tmp_path, files) == [("FSDP104", "error")]


def test_yaml_mapping_with_the_flag_off_gives_nothing(tmp_path):
    files = {"train.py": YAML_DICT, "run.sh": "torchrun --nproc_per_node 8 train.py --config job.yaml\n",
             "job.yaml": "model:\n  name: meta-llama/Llama-3.1-8B\npeft:\n  q_lora: false\n"}
    assert lint(tmp_path, files) == []


def test_omegaconf_section_passed_renamed_to_a_helper_of_another_module(tmp_path):
    files = {"train.py": OMEGA_MAIN, "builders.py": OMEGA_BUILDERS,
             "run.sh": "accelerate launch --use_fsdp train.py -c cfg.yaml\n",
             "cfg.yaml": "model:\n  name: meta-llama/Llama-3.1-8B\npeft:\n  q_lora: true\n  lora_r: 16\n"}
    assert lint(tmp_path, files) == [("FSDP104", "error")]


def test_command_line_override_wins_over_the_file(tmp_path):
    files = {"train.py": OMEGA_MAIN, "builders.py": OMEGA_BUILDERS,
             "run.sh": "accelerate launch --use_fsdp train.py -c cfg.yaml peft.q_lora=false\n",
             "cfg.yaml": "model:\n  name: meta-llama/Llama-3.1-8B\npeft:\n  q_lora: true\n"}
    assert lint(tmp_path, files) == []
    files["run.sh"] = "accelerate launch --use_fsdp train.py -c cfg.yaml \"peft.q_lora=true\"\n"
    files["cfg.yaml"] = "model:\n  name: meta-llama/Llama-3.1-8B\npeft:\n  q_lora: false\n"
    assert lint(tmp_path, files) == [("FSDP104", "error")]


def test_absent_key_takes_the_get_default(tmp_path):
    base = {"run.sh": "torchrun --nproc_per_node 4 train.py job.json\n", "job.json": '{"model": "gpt2"}\n'}
    assert lint(tmp_path, {**base, "train.py": GET_DEFAULT.replace("{default}", "False")}) == []
    assert lint(tmp_path, {**base, "train.py": GET_DEFAULT.replace("{default}", "True")}) == [("FSDP104", "error")]


def test_key_set_in_the_json_file_wins_over_the_get_default(tmp_path):
    files = {"run.sh": "torchrun --nproc_per_node 4 train.py job.json\n",
             "job.json": '{"model": "gpt2", "quantize": true}\n',
             "train.py": GET_DEFAULT.replace("{default}", "False")}
    assert lint(tmp_path, files) == [("FSDP104", "error")]


def test_dataclass_config_key_the_file_lacks_is_unknown_not_false(tmp_path):
    # The class fills absent keys from defaults this linter does not read: the branch stays (as a test of a
    # run-time value does), never ruled out as if the key were false.
    files = {"train.py": DATACLASS, "myjob/__init__.py": "", "myjob/config.py": "class JobConfig:\n    pass\n",
             "run.sh": "accelerate launch --use_fsdp train.py --config job.yaml\n",
             "job.yaml": "model:\n  name: gpt2\npeft:\n  lora_r: 8\n"}
    assert [code for code, _ in lint(tmp_path, files)] == ["FSDP104"]
    files["job.yaml"] = "model:\n  name: gpt2\npeft:\n  q_lora: true\n"
    assert lint(tmp_path, files) == [("FSDP104", "error")]
    files["job.yaml"] = "model:\n  name: gpt2\npeft:\n  q_lora: false\n"
    assert lint(tmp_path, files) == []


def test_an_override_whose_value_is_unknown_leaves_the_other_keys_known(tmp_path):
    files = {"train.py": OMEGA_MAIN, "builders.py": OMEGA_BUILDERS,
             "run.sh": 'accelerate launch --use_fsdp train.py -c cfg.yaml "run.name=${RUN_NAME}"\n',
             "cfg.yaml": "model:\n  name: meta-llama/Llama-3.1-8B\npeft:\n  q_lora: true\n"}
    assert lint(tmp_path, files) == [("FSDP104", "error")]
    # `"$@"`: any key may come from the command line; the file's `true` is then not certain.
    files["run.sh"] = 'accelerate launch --use_fsdp train.py -c cfg.yaml "$@"\n'
    files["cfg.yaml"] = "model:\n  name: meta-llama/Llama-3.1-8B\npeft:\n  q_lora: false\n"
    assert [code for code, _ in lint(tmp_path, files)] == ["FSDP104"]


def test_linting_the_project_reports_the_decided_finding_in_the_helpers_module(tmp_path):
    # builders.py linted on its own cannot know `peft_params.q_lora`; the launch of train.py decides it, and the
    # finding is reported once, in builders.py, as the error the launch gives.
    files = {"train.py": OMEGA_MAIN, "builders.py": OMEGA_BUILDERS,
             "run.sh": "accelerate launch --use_fsdp train.py -c cfg.yaml\n",
             "cfg.yaml": "model:\n  name: meta-llama/Llama-3.1-8B\npeft:\n  q_lora: true\n"}
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'job'\n")
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    r = CliRunner().invoke(main, ["check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                                  *TARGETS, str(tmp_path)])
    found = [(Path(f["filename"]).name, f["severity"]) for f in json.loads(r.stdout) if f["code"] == "FSDP104"]
    assert found == [("builders.py", "error")]
