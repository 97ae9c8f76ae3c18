"""An error in code that runs only for some literal cases of a value that no launch or config that was read
gives (a builder for a few model names, the branch of one mode) is a warning naming the case; the same code
under a launch that selects the case is an error, and one the launch rules out is silent."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main

BUILDERS = """\
from transformers import AutoModelForCausalLM, BitsAndBytesConfig


def build_vision_model(name):
    return AutoModelForCausalLM.from_pretrained(name, quantization_config=BitsAndBytesConfig(load_in_8bit=True))


def build_text_model(name):
    return AutoModelForCausalLM.from_pretrained(name)
"""

TRAIN_BY_NAME = """\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from builders import build_text_model, build_vision_model


def build(config):
    if config.model.model_name in ("acme/vision-8b", "acme/vision-13b"):
        model = build_vision_model(config.model.model_name)
    else:
        model = build_text_model(config.model.model_name)
    return FSDP(model)
"""

TRAIN_BY_MODE = """\
import argparse
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

parser = argparse.ArgumentParser()
parser.add_argument("--mode")
args = parser.parse_args()
quant = None
if args.mode == "int8":
    quant = BitsAndBytesConfig(load_in_8bit=True)
model = AutoModelForCausalLM.from_pretrained("m", quantization_config=quant)
model = FSDP(model)
"""


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def _lint(path: Path, *extra) -> list[dict]:
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--output-format", "json",
                                  "--target-version", "torch=2.6", "--target-version", "transformers=5.24.0",
                                  "--target-version", "bitsandbytes=0.50.2", *extra, str(path)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return [f for f in json.loads(r.stdout) if f["code"] == "FSDP203"]


def test_builder_for_some_model_names_is_a_warning_naming_them(tmp_path):
    root = _write(tmp_path / "repo", {"pyproject.toml": "[project]\nname = 'x'\n", "builders.py": BUILDERS,
                                      "train.py": TRAIN_BY_NAME})
    found = _lint(root)
    assert found and all(f["severity"] == "warning" for f in found)
    assert any("acme/vision-8b" in f["message"] for f in found)


def test_helper_called_only_for_one_mode_of_an_unread_config_is_a_warning(tmp_path):
    # The 8-bit helper runs only at the call under `cfg.quant.mode == "int8"`; the config is loaded at run time.
    root = _write(tmp_path / "repo", {"pyproject.toml": "[project]\nname = 'x'\n", "train.py": """\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from omegaconf import OmegaConf


def load_int8(name):
    return AutoModelForCausalLM.from_pretrained(name, quantization_config=BitsAndBytesConfig(load_in_8bit=True))


def main(path):
    cfg = OmegaConf.load(path)
    model = None
    if cfg.quant.mode == "int8":
        model = load_int8(cfg.name)
    FSDP(model)


if __name__ == "__main__":
    main("job.yaml")
"""})
    [f] = _lint(root)
    assert f["severity"] == "warning" and 'cfg.quant.mode == "int8"' in f["message"]


def test_mode_branch_selected_by_the_launch_is_an_error(tmp_path):
    root = _write(tmp_path / "repo", {"pyproject.toml": "[project]\nname = 'x'\n", "train.py": TRAIN_BY_MODE,
                                      "run.sh": "torchrun --nproc_per_node 2 train.py --mode int8\n"})
    [f] = _lint(root)
    assert f["severity"] == "error"


def test_mode_branch_ruled_out_by_the_launch_is_silent(tmp_path):
    root = _write(tmp_path / "repo", {"pyproject.toml": "[project]\nname = 'x'\n", "train.py": TRAIN_BY_MODE,
                                      "run.sh": "torchrun --nproc_per_node 2 train.py --mode bf16\n"})
    assert _lint(root) == []
