"""A 4-bit storage that differs by branch (`storage = None`, then `storage = torch.bfloat16` under an `if`):
the set of values the storage may hold, with the condition that picks the integer one. A warning naming
that condition when nothing the file reads decides it, an error when the launch decides it, nothing when
every path gives a float storage. Asserted through the CLI, in the shapes users write."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

TARGETS = ["--target-version", "torch=2.6", "--target-version", "transformers=4.57.1",
           "--target-version", "bitsandbytes=0.50.2", "--target-version", "peft=0.21.2"]

HEAD = """
import argparse
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
"""


def findings(tmp: Path, body: str, launch: str = "") -> list[tuple[str, str, str]]:
    (tmp / "pyproject.toml").write_text("[project]\nname = 'job'\n")
    (tmp / "train.py").write_text(textwrap.dedent(HEAD) + textwrap.dedent(body))
    if launch:
        (tmp / "run.sh").write_text(f"#!/bin/sh\ntorchrun --nproc_per_node 2 train.py {launch}\n")
    r = CliRunner().invoke(main, ["check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                                  *TARGETS, str(tmp)])
    assert r.exit_code == 0, r.output
    return [(f["code"], f["severity"], f["message"]) for f in json.loads(r.stdout) if f["code"] == "FSDP202"]


# The storage is chosen under a condition nothing in the file decides (a function parameter, a runtime probe).
UNDECIDED = {
    "none-then-if": """
        def build(args):
            storage = None
            if args.bf16:
                storage = torch.bfloat16
            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=storage)
            return FSDP(AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16))
        """,
    "uint8-else": """
        def build(cfg):
            if cfg.storage_float:
                storage = torch.bfloat16
            else:
                storage = torch.uint8
            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=storage)
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
            return FSDP(model)
        """,
    "runtime-probe": """
        storage = None
        if torch.cuda.is_bf16_supported():
            storage = torch.bfloat16
        model = AutoModelForCausalLM.from_pretrained(
            "m", torch_dtype=torch.bfloat16,
            quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=storage))
        model = FSDP(model)
        """,
}


@pytest.mark.parametrize("shape", sorted(UNDECIDED))
def test_storage_integer_on_an_undecided_path_is_a_warning_naming_the_condition(tmp_path, shape):
    got = findings(tmp_path, UNDECIDED[shape])
    assert [(c, s) for c, s, _ in got] == [("FSDP202", "warning")], got
    msg = got[0][2]
    assert " when " in msg and ("bf16" in msg or "storage_float" in msg), msg


def test_every_path_float_gives_nothing(tmp_path):
    got = findings(tmp_path, """
        def build(args):
            storage = torch.float16
            if args.bf16:
                storage = torch.bfloat16
            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=storage)
            return FSDP(AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=storage))
        """)
    assert got == []


PARSED = """
    p = argparse.ArgumentParser()
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args()
    storage = None
    if args.bf16:
        storage = torch.bfloat16
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=storage)
    model = FSDP(AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16))
    """


def test_the_launch_deciding_the_integer_path_is_an_error(tmp_path):
    got = findings(tmp_path, PARSED, launch=" ")
    assert [(c, s) for c, s, _ in got] == [("FSDP202", "error")], got


def test_the_launch_deciding_the_float_path_gives_nothing(tmp_path):
    assert findings(tmp_path, PARSED, launch="--bf16") == []
