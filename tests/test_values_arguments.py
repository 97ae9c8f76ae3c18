"""Parsed arguments as users write them: an `HfArgumentParser` dataclass `bool` field set by the launch
(`--use_4bit True`, a bare `--use_4bit`), and the object a trainer receives as `args=` read as training
arguments even when its class cannot be read. Asserted through the CLI."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main
from values_support import decided

TARGETS = ["--target-version", "torch=2.6", "--target-version", "peft=0.21.2",
           "--target-version", "transformers=5.24.0", "--target-version", "bitsandbytes=0.50.2",
           "--target-version", "accelerate=1.15.0"]


def codes(tmp: Path, files: dict) -> list[str]:
    (tmp / "pyproject.toml").write_text("[project]\nname = 'job'\n")
    for name, text in files.items():
        (tmp / name).write_text(textwrap.dedent(text))
    r = CliRunner().invoke(main, ["check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                                  *TARGETS, str(tmp / "train.py")])
    assert r.exit_code == 0, r.output
    return sorted(f["code"] for f in json.loads(r.stdout) if decided(f))


DATACLASS = """
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class ScriptArguments:
    use_4bit: {kind} = field(default=False, metadata={{"help": "load the base in 4 bits"}})
    model_name: str = "m"
"""
SCRIPT = """
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, HfArgumentParser
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import fully_shard
{imports}

def main():
    parser = HfArgumentParser(ScriptArguments)
    {parse}
    bnb = BitsAndBytesConfig(load_in_4bit=script_args.use_4bit, bnb_4bit_quant_storage=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(script_args.model_name, quantization_config=bnb)
    model = get_peft_model(model, LoraConfig(r=8))
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)


main()
"""
PARSES = ["(script_args,) = parser.parse_args_into_dataclasses()",
          "script_args = parser.parse_args_into_dataclasses()[0]"]


@pytest.mark.parametrize("where", ["same_file", "other_module"])
@pytest.mark.parametrize("kind", ["bool", "Optional[bool]"])
@pytest.mark.parametrize("parse", PARSES, ids=["unpacked", "indexed"])
@pytest.mark.parametrize("words, sharded_4bit", [
    ("--use_4bit True", True), ("--use_4bit", True), ("--use_4bit=true", True),
    ("--use_4bit False", False), ("", False),
], ids=["True", "bare", "eq-true", "False", "absent"])
def test_a_dataclass_bool_field_set_by_the_launch(tmp_path, where, kind, parse, words, sharded_4bit):
    dc = DATACLASS.format(kind=kind)
    if where == "same_file":
        files = {"train.py": dc + SCRIPT.format(imports="", parse=parse)}
    else:
        files = {"script_args.py": dc, "train.py": SCRIPT.format(imports="from script_args import ScriptArguments",
                                                                  parse=parse)}
    files["run.sh"] = f"torchrun --nproc_per_node 8 train.py {words}\n"
    assert codes(tmp_path, files) == (["FSDP201"] if sharded_4bit else [])


TRAINER = """
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, HfArgumentParser, Trainer
from peft import LoraConfig, get_peft_model
from {module} import ModelArguments, MyTrainingArguments


def main():
    parser = HfArgumentParser((ModelArguments, MyTrainingArguments))
    model_args, training_args = parser.parse_args_into_dataclasses()
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=8))
    trainer = {trainer}
    trainer.train()


main()
"""
HPARAMS = """
from dataclasses import dataclass
from someorg.base import BaseTrainingArguments


@dataclass
class MyTrainingArguments(BaseTrainingArguments):
    extra_flag: int = 1


@dataclass
class ModelArguments:
    name: str = "m"
"""


@pytest.mark.parametrize("module", ["someorg.hparams", "hparams"], ids=["unknown-import", "project-subclass"])
@pytest.mark.parametrize("trainer", ["Trainer(model=model, args=training_args)", "Trainer(model, training_args)"])
@pytest.mark.parametrize("fsdp, trained_sharded", [('--fsdp "full_shard auto_wrap"', True), ("", False)])
def test_trainer_args_of_an_unreadable_class_are_training_arguments(tmp_path, module, trainer, fsdp, trained_sharded):
    """The launch's `--fsdp` reaches the Trainer through an arguments class fsdplint cannot read: the 4-bit
    model is then trained under FSDP (FSDP201 with transformers 5, whose Trainer shards with FSDP2)."""
    files = {"train.py": TRAINER.format(module=module, trainer=trainer),
             "run.sh": f"torchrun --nproc_per_node 8 train.py {fsdp} --output_dir out\n"}
    if module == "hparams":
        files["hparams.py"] = HPARAMS
    assert codes(tmp_path, files) == (["FSDP201"] if trained_sharded else [])
