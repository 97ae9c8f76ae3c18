"""A finding whose faulty statement sits in another module of the project: reported at the call when
only the caller is linted; reported at the statement, once, with the calls as related locations, when
that module is linted too (as a directory, as named files, with one job or two)."""

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

UTILS = """\
from torch.distributed.fsdp import fully_shard


def shard(model):
    for layer in model.model.layers:
        fully_shard(layer)
    return fully_shard(model)
"""
TRAIN = """\
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model
from utils import shard


def {name}():
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb)
    model = shard(get_peft_model(model, LoraConfig(r=8)))


{name}()
"""


@pytest.fixture
def job(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'job'\n")
    (tmp_path / "utils.py").write_text(UTILS)
    (tmp_path / "train.py").write_text(TRAIN.format(name="main"))
    (tmp_path / "train_dpo.py").write_text(TRAIN.format(name="run"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def lint(*args: str) -> list[dict]:
    r = CliRunner().invoke(main, ["check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                                  *TARGETS, *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_only_the_caller_linted_reports_at_the_call(job):
    (f,) = lint("train.py")
    assert (f["code"], f["filename"], f["location"]["row"]) == ("FSDP201", "train.py", 10)
    assert "(in utils.py:6)" in f["message"]
    assert [(r["filename"], r["location"]["row"]) for r in f["related"]] == [("utils.py", 6)]


@pytest.mark.parametrize("args", [(".",), ("train.py", "utils.py"), ("utils.py", "train.py", "train_dpo.py"),
                                  ("-j", "2", ".")], ids=["directory", "two-files", "three-files", "two-jobs"])
def test_the_faulty_statement_linted_too_gets_the_finding_once(job, args):
    found = lint(*args)
    assert [(f["code"], f["filename"], f["location"]["row"]) for f in found] == [("FSDP201", "utils.py", 6)]
    (f,) = found
    assert "(in utils.py" not in f["message"]
    callers = {(r["filename"], r["location"]["row"]) for r in f["related"]}
    assert ("train.py", 10) in callers
    if "train_dpo.py" in args or "." in args:
        assert ("train_dpo.py", 10) in callers


def test_the_module_alone_gives_nothing(job):
    assert lint("utils.py") == []
