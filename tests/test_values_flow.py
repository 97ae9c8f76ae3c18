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
    """(code, severity, file name) of each finding on `target`, linted with its project."""
    (tmp / "pyproject.toml").write_text("[project]\nname = 'job'\n")
    for name, text in files.items():
        (tmp / name).write_text(textwrap.dedent(text))
    r = CliRunner().invoke(main, ["check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                                  *TARGETS, str(tmp / target)])
    assert r.exit_code == 0, r.output
    return sorted((f["code"], f["severity"], Path(f["filename"]).name) for f in json.loads(r.stdout))


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
    assert lint(tmp_path, files) == [("FSDP201", "error", "train.py")]


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
    assert lint(tmp_path, {"train.py": src}) == [("FSDP201", "error", "train.py")]


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
    ("NS.use_4bit", "--use_4bit", [("FSDP201", "error", "train.py")]),
    ("NS.bits == 4", "--bits 4", [("FSDP201", "error", "train.py")]),
    ("NS.bits != 16", "--bits 4", [("FSDP201", "error", "train.py")]),
    ("NS.bits in (4, 8)", "--bits 4", [("FSDP201", "error", "train.py")]),
    ("not NS.bits == 16", "--bits 4", [("FSDP201", "error", "train.py")]),
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
    ("--use_4bit", [("FSDP201", "error", "train.py")]),
    # The flag is opt-in: left off by the launch, the 4-bit branch may still be switched on (a warning).
    ("", [("FSDP201", "warning", "train.py")]),
    (None, [("FSDP201", "warning", "train.py")]),
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

