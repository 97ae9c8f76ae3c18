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


# `BitsAndBytesConfig(**d)` with the dict filled in exclusive branches, or given its storage by a write under
# an `if` nothing decides: each path's keywords are read.
DICT_UNDECIDED = {
    "exclusive-branches": """
        def build(cfg):
            if cfg.float_storage:
                qkw = dict(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
            else:
                qkw = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
            bnb = BitsAndBytesConfig(**qkw)
            return FSDP(AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16))
        """,
    "write-replaces-float": """
        def build(cfg):
            qkw = dict(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
            if cfg.pack_uint8:
                qkw["bnb_4bit_quant_storage"] = torch.uint8
            model = AutoModelForCausalLM.from_pretrained(
                "m", quantization_config=BitsAndBytesConfig(**qkw), torch_dtype=torch.bfloat16)
            return FSDP(model)
        """,
    "update-replaces-float": """
        qkw = {"load_in_4bit": True, "bnb_4bit_quant_storage": torch.bfloat16}
        if not torch.cuda.is_bf16_supported():
            qkw.update(bnb_4bit_quant_storage="uint8")
        bnb = BitsAndBytesConfig(**qkw)
        model = FSDP(AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16))
        """,
}


@pytest.mark.parametrize("shape", sorted(DICT_UNDECIDED))
def test_dict_storage_integer_on_one_path_is_a_warning_naming_the_condition(tmp_path, shape):
    got = findings(tmp_path, DICT_UNDECIDED[shape])
    assert [(c, s) for c, s, _ in got] == [("FSDP202", "warning")], got
    assert " when " in got[0][2], got


def test_dict_branches_both_float_give_nothing(tmp_path):
    got = findings(tmp_path, """
        def build(cfg):
            if cfg.fp16:
                qkw = dict(load_in_4bit=True, bnb_4bit_quant_storage=torch.float16)
                dtype = torch.float16
            else:
                qkw = dict(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
                dtype = torch.bfloat16
            bnb = BitsAndBytesConfig(**qkw)
            return FSDP(AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=dtype))
        """)
    assert got == []


def test_dict_branches_both_without_storage_is_an_error(tmp_path):
    got = findings(tmp_path, """
        def build(cfg):
            if cfg.double_quant:
                qkw = dict(load_in_4bit=True, bnb_4bit_use_double_quant=True)
            else:
                qkw = dict(load_in_4bit=True)
            bnb = BitsAndBytesConfig(**qkw)
            return FSDP(AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16))
        """)
    assert [(c, s) for c, s, _ in got] == [("FSDP202", "error")], got


def test_dict_branch_that_is_not_4bit_gives_nothing(tmp_path):
    got = findings(tmp_path, """
        def build(cfg):
            if cfg.eight_bit:
                qkw = dict(load_in_8bit=True)
            else:
                qkw = dict(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
            bnb = BitsAndBytesConfig(**qkw)
            return FSDP(AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16))
        """)
    assert [c for c, _, _ in got] == [], got
