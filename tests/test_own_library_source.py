"""Linting a library's own repository: its functions are read from the tree, not from the release table.

fsdplint knows what trl's `get_quantization_config` builds in each trl release (apis.RETURNED_CONFIGS). In
trl's own repository the script's `from trl import get_quantization_config` runs the tree's function, whatever
release a pin names, so the tree's source decides the 4-bit storage. Each test writes a small library tree
(the package, an example script, an FSDP1 launch) and runs the real CLI on it.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main

SCRIPT = """\
from trl import ModelConfig, SFTConfig, SFTTrainer, TrlParser, get_quantization_config


def run(training_args, model_args):
    bnb = get_quantization_config(model_args)
    training_args.model_init_kwargs = {"quantization_config": bnb}
    SFTTrainer(model=model_args.model_name_or_path, args=training_args).train()


if __name__ == "__main__":
    training_args, model_args = TrlParser((SFTConfig, ModelConfig)).parse_args_and_config()
    run(training_args, model_args)
"""

HELPER = """\
from transformers import BitsAndBytesConfig


def get_quantization_config(model_args):
    if model_args.load_in_4bit:
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_compute_dtype=model_args.torch_dtype,{storage}
        )
    if model_args.load_in_8bit:
        return BitsAndBytesConfig(load_in_8bit=True)
    return None
"""

FSDP1_YAML = """\
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_version: 1
num_processes: 2
"""

LAUNCH = ("accelerate launch --config_file fsdp.yaml examples/sft.py --load_in_4bit --torch_dtype bfloat16 "
          "--use_peft")


def _tree(tmp_path: Path, storage: str, pin: str = "trl==0.12.0", whole: bool = True) -> Path:
    root = tmp_path / "repo"
    package = {
        "pyproject.toml": "[project]\nname = 'trl'\n",
        "trl/__init__.py": "from .trainer.utils import get_quantization_config\n",
        "trl/trainer/__init__.py": "",
    } if whole else {}
    files = {
        **package,
        "requirements.txt": pin + "\ntorch==2.4.0\nbitsandbytes==0.43.1\n",
        "trl/trainer/utils.py": HELPER.format(storage=storage),
        "examples/sft.py": SCRIPT,
        "fsdp.yaml": FSDP1_YAML,
        "launch.sh": "#!/bin/bash\n" + LAUNCH + "\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _fsdp202(root: Path) -> list[dict]:
    r = CliRunner().invoke(main, ["check", str(root), "--exit-zero", "--no-cache",
                                  "--output-format", "json", "--select", "FSDP202"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return [f for f in json.loads(r.stdout) if f["code"] == "FSDP202"]


def test_the_trees_own_helper_without_storage_is_reported_whatever_release_is_pinned(tmp_path):
    # trl 0.12 (the pin) takes the storage from torch_dtype; the tree's helper passes none.
    (f,) = _fsdp202(_tree(tmp_path, storage=""))
    assert f["severity"] == "error"
    assert f["location"]["row"] == 5  # the get_quantization_config(model_args) call
    assert "trl/trainer/utils.py:4" in f["message"]


def test_a_checkout_of_the_module_alone_is_read_too(tmp_path):
    # Only trl/trainer/utils.py and the script, as a partial checkout holds them.
    (f,) = _fsdp202(_tree(tmp_path, storage="", whole=False))
    assert "trl/trainer/utils.py:4" in f["message"]


def test_the_trees_own_helper_with_storage_is_not_reported_on_an_old_pin(tmp_path):
    # trl 0.9 (the pin) passed no storage; the tree's helper takes it from --torch_dtype (bfloat16).
    storage = "\n            bnb_4bit_quant_storage=model_args.torch_dtype,"
    assert _fsdp202(_tree(tmp_path, storage=storage, pin="trl==0.9.4")) == []


def test_a_helper_whose_storage_cannot_be_read_is_not_judged_by_the_release_table(tmp_path):
    # The tree's helper takes the storage from a module constant: not read, so neither it nor trl 0.9's
    # table entry (no storage) decides, and nothing is reported.
    storage = "\n            bnb_4bit_quant_storage=STORAGE,"
    root = _tree(tmp_path, storage=storage, pin="trl==0.9.4")
    assert _fsdp202(root) == []
