"""Values that survive ordinary code: what a helper returns as an expression, parsed arguments handed to
helpers under another name, and comparisons of them. Each case is a 4-bit model sharded by `fully_shard`
(FSDP201) written the way users write it; the finding must be the one a user sees through the CLI."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main
from values_support import label

TARGETS = ["--target-version", "torch=2.6", "--target-version", "peft=0.21.2",
           "--target-version", "transformers=5.24.0", "--target-version", "bitsandbytes=0.50.2",
           "--target-version", "accelerate=1.15.0"]

HEAD = """\
import argparse
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import fully_shard
"""
SHARD = """
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)


main()
"""
BNB = 'BitsAndBytesConfig(load_in_4bit={four}, bnb_4bit_quant_storage=torch.bfloat16)'
PARSE = """
def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--bits", type=int, default=16)
    p.add_argument("--use_4bit", action="store_true")
    return p.parse_args()
"""


def lint(tmp: Path, files: dict, target: str = "train.py") -> list[tuple[str, str, str]]:
    """(code, severity or FSDP201's decided/opt-in, file name) of each finding on `target`, linted with its project."""
    (tmp / "pyproject.toml").write_text("[project]\nname = 'job'\n")
    for name, text in files.items():
        (tmp / name).write_text(textwrap.dedent(text))
    r = CliRunner().invoke(main, ["check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                                  *TARGETS, str(tmp / target)])
    assert r.exit_code == 0, r.output
    return sorted((f["code"], label(f), Path(f["filename"]).name) for f in json.loads(r.stdout))


# -- a helper's `return` of an expression -------------------------------------------------------------
LOADERS = {
    "peft_call": """
        def load():
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=%s)
            return get_peft_model(model, LoraConfig(r=8))
    """,
    "peft_of_cuda": """
        def load():
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=%s)
            return get_peft_model(model.to(torch.bfloat16), LoraConfig(r=8))
    """,
    "method_chain": """
        def load():
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=%s)
            model = get_peft_model(model, LoraConfig(r=8))
            return model.cuda()
    """,
    "loader_call": """
        def _base():
            return AutoModelForCausalLM.from_pretrained("m", quantization_config=%s)

        def load():
            return get_peft_model(_base(), LoraConfig(r=8))
    """,
    "branches": """
        def load(lora=True):
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=%s)
            if lora:
                return get_peft_model(model, LoraConfig(r=8))
            else:
                return model.train()
    """,
}


@pytest.mark.parametrize("where", ["same_module", "other_module"])
@pytest.mark.parametrize("shape", sorted(LOADERS))
def test_a_returned_expression_is_the_model(tmp_path, shape, where):
    helper = textwrap.dedent(LOADERS[shape]) % BNB.format(four="True")
    caller = "\ndef main():\n    model = load()\n" + SHARD
    if where == "same_module":
        files = {"train.py": HEAD + helper + caller}
    else:
        files = {"model_utils.py": HEAD + helper, "train.py": HEAD + "from model_utils import load\n" + caller}
    assert lint(tmp_path, files) == [("FSDP201", "decided", "train.py")]


def test_a_returned_wrapper_call_is_the_model(tmp_path):
    """`return fully_shard(model)` in a helper: the caller's model is sharded (FSDP201 at the shard)."""
    src = HEAD + """
def shard(model):
    for layer in model.model.layers:
        fully_shard(layer)
    return fully_shard(model)


def main():
    model = AutoModelForCausalLM.from_pretrained("m", quantization_config=%s)
    model = shard(get_peft_model(model, LoraConfig(r=8)))
    model.train()


main()
""" % BNB.format(four="True")
    assert lint(tmp_path, {"train.py": src}) == [("FSDP201", "decided", "train.py")]


def test_a_returned_expression_of_a_full_precision_model_gives_nothing(tmp_path):
    helper = textwrap.dedent(LOADERS["peft_call"]) % "None"
    assert lint(tmp_path, {"train.py": HEAD + helper + "\ndef main():\n    model = load()\n" + SHARD}) == []


# -- parsed arguments handed to helpers -------------------------------------------------------------
BUILDERS = {
    "positional_renamed": ("def build(args):", "build(model_args)"),
    "keyword_renamed": ("def build(name, cfg=None):", 'build("m", cfg=model_args)'),
    "same_name": ("def build(model_args):", "build(model_args)"),
}


def _builder(sig: str, four: str) -> str:
    ns = sig[sig.index("(") + 1:].split(",")[-1].split("=")[0].strip(" ):")
    return f"""
{sig}
    bnb = {BNB.format(four=four.replace("NS", ns))}
    model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb)
    return get_peft_model(model, LoraConfig(r=8))
"""


@pytest.mark.parametrize("where", ["same_module", "other_module"])
@pytest.mark.parametrize("shape", sorted(BUILDERS))
@pytest.mark.parametrize("four, launch, expected", [
    ("NS.use_4bit", "--use_4bit", [("FSDP201", "decided", "train.py")]),
    ("NS.bits == 4", "--bits 4", [("FSDP201", "decided", "train.py")]),
    ("NS.bits != 16", "--bits 4", [("FSDP201", "decided", "train.py")]),
    ("NS.bits in (4, 8)", "--bits 4", [("FSDP201", "decided", "train.py")]),
    ("not NS.bits == 16", "--bits 4", [("FSDP201", "decided", "train.py")]),
    ("NS.bits == 4", "--bits 16", []),
    ("NS.bits == 4", "", []),
], ids=["flag", "eq", "ne", "in", "not", "eq-off", "eq-default"])
def test_parsed_arguments_reach_a_helper_under_any_name(tmp_path, shape, where, four, launch, expected):
    sig, call = BUILDERS[shape]
    helper = _builder(sig, four)
    caller = f"\ndef main():\n    model_args = parse()\n    model = {call}\n" + SHARD
    if where == "same_module":
        files = {"train.py": HEAD + PARSE + helper + caller}
    else:
        files = {"model_utils.py": HEAD + helper, "train.py": HEAD + PARSE + "from model_utils import build\n" + caller}
    files["run.sh"] = f"torchrun --nproc_per_node 8 train.py {launch}\n"
    assert lint(tmp_path, files) == expected


@pytest.mark.parametrize("launch, expected", [
    ("--use_4bit", [("FSDP201", "decided", "train.py")]),
    # The flag is opt-in: left off by the launch, the 4-bit branch may still be switched on (a warning).
    ("", [("FSDP201", "opt-in", "train.py")]),
    (None, [("FSDP201", "opt-in", "train.py")]),
])
def test_a_branch_on_a_renamed_namespace_is_decided_by_the_launch(tmp_path, launch, expected):
    src = HEAD + PARSE + """
def build(opts):
    bnb = None
    if opts.use_4bit:
        bnb = %s
    model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb)
    return get_peft_model(model, LoraConfig(r=8))


def main():
    model_args = parse()
    model = build(model_args)
""" % BNB.format(four="True") + SHARD
    files = {"train.py": src}
    if launch is not None:
        files["run.sh"] = f"torchrun --nproc_per_node 8 train.py {launch}\n"
    assert lint(tmp_path, files) == expected



# -- the shape of peft's examples/sft: dataclass fields read in another module's helper -----------------
SFT_UTILS = """
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import LoraConfig

def create_and_prepare_model(args, data_args, training_args):
    bnb_config = None
    quant_storage_dtype = None
    if args.use_4bit_quantization:
        compute_dtype = getattr(torch, args.bnb_4bit_compute_dtype)
        quant_storage_dtype = getattr(torch, args.bnb_4bit_quant_storage_dtype)
        bnb_config = BitsAndBytesConfig(
            load_in_4bit=args.use_4bit_quantization,
            bnb_4bit_quant_type=args.bnb_4bit_quant_type,
            bnb_4bit_compute_dtype=compute_dtype,
            bnb_4bit_use_double_quant=args.use_nested_quant,
            bnb_4bit_quant_storage=quant_storage_dtype,
        )
    model = AutoModelForCausalLM.from_pretrained(
        args.model_name_or_path,
        quantization_config=bnb_config,
        torch_dtype=torch.bfloat16,
    )
    peft_config = LoraConfig(r=args.lora_r, target_modules=args.lora_target_modules.split(","))
    return model, peft_config
"""
SFT_TRAIN = """
from dataclasses import dataclass, field
from typing import Optional
from transformers import HfArgumentParser, TrainingArguments, Trainer
from utils import create_and_prepare_model

@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="m")
    lora_r: Optional[int] = field(default=64)
    lora_target_modules: Optional[str] = field(default="q_proj,k_proj,v_proj,o_proj")
    use_nested_quant: Optional[bool] = field(default=False)
    bnb_4bit_compute_dtype: Optional[str] = field(default="float16")
    bnb_4bit_quant_storage_dtype: Optional[str] = field(default="uint8")
    bnb_4bit_quant_type: Optional[str] = field(default="nf4")
    use_4bit_quantization: Optional[bool] = field(default=False)

@dataclass
class DataTrainingArguments:
    dataset_name: Optional[str] = field(default="d")

def main(model_args, data_args, training_args):
    model, peft_config = create_and_prepare_model(model_args, data_args, training_args)
    trainer = Trainer(model=model, args=training_args, peft_config=peft_config)
    trainer.train()

if __name__ == "__main__":
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    main(model_args, data_args, training_args)
"""
ACCELERATE_FSDP1 = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n  fsdp_use_orig_params: true\nnum_processes: 8\n"


@pytest.mark.parametrize("storage, expected", [("uint8", [("FSDP202", "error", "train.py")]), ("bfloat16", [])])
def test_dataclass_fields_through_a_helper_of_another_module(tmp_path, storage, expected):
    """`create_and_prepare_model(model_args, ...)` defined as `(args, ...)` in utils.py, reading
    `getattr(torch, args.bnb_4bit_quant_storage_dtype)` under `if args.use_4bit_quantization:` set to True by
    the launch: a uint8 storage under FSDP1 next to bfloat16 weights cannot be flattened (FSDP202)."""
    files = {"utils.py": SFT_UTILS, "train.py": SFT_TRAIN, "fsdp.yaml": ACCELERATE_FSDP1,
             "run.sh": "accelerate launch --config_file fsdp.yaml train.py --use_4bit_quantization True "
                       f"--bnb_4bit_quant_storage_dtype {storage} --bf16 True --output_dir out\n"}
    assert lint(tmp_path, files) == expected
