"""A dict key that an `if` the known values do not decide may replace (`kw["device_map"] = "auto"` under
`if cfg.quantize:`): the value goes unknown, and the rule reads both paths instead of saying nothing: a
warning naming the condition. Asserted through the CLI, in the shapes users write."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

TARGETS = ["--target-version", "torch=2.6", "--target-version", "transformers=4.57.1",
           "--target-version", "accelerate=1.15.0", "--target-version", "peft=0.21.2"]

HEAD = """
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoModelForCausalLM
"""


def fsdp009(tmp: Path, body: str) -> list[tuple[str, str]]:
    (tmp / "pyproject.toml").write_text("[project]\nname = 'job'\n")
    (tmp / "train.py").write_text(textwrap.dedent(HEAD) + textwrap.dedent(body))
    r = CliRunner().invoke(main, ["check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                                  *TARGETS, str(tmp / "train.py")])
    assert r.exit_code == 0, r.output
    return [(f["severity"], f["message"]) for f in json.loads(r.stdout) if f["code"] == "FSDP009"]


SHAPES = {
    "subscript-write": """
        def build(cfg):
            kw = dict(torch_dtype=torch.bfloat16, device_map=None)
            if cfg.quantize:
                kw["device_map"] = "auto"
            model = AutoModelForCausalLM.from_pretrained("m", **kw)
            return FSDP(model)
        """,
    "update-call": """
        def build(cfg):
            kw = {"torch_dtype": torch.bfloat16, "device_map": None}
            if cfg.big_model:
                kw.update(device_map="balanced")
            model = AutoModelForCausalLM.from_pretrained("m", **kw)
            return FSDP(model)
        """,
    "exclusive-branches": """
        def build(cfg):
            if cfg.offload:
                kw = dict(device_map="auto", offload_folder="off")
            else:
                kw = dict(torch_dtype=torch.bfloat16)
            model = AutoModelForCausalLM.from_pretrained("m", **kw)
            model = FSDP(model)
            return model
        """,
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_dispatch_on_one_undecided_path_is_a_warning_naming_it(tmp_path, shape):
    got = fsdp009(tmp_path, SHAPES[shape])
    assert [s for s, _ in got] == ["warning"], got
    assert "(when " in got[0][1], got


def test_a_path_chosen_by_the_launch_mode_gives_nothing(tmp_path):
    # `if world_size == 1:` dispatches only when FSDP is off: correlated with the launch, not reported.
    got = fsdp009(tmp_path, """
        def build(world_size):
            kw = dict(torch_dtype=torch.bfloat16, device_map=None)
            if world_size == 1:
                kw["device_map"] = "auto"
            model = AutoModelForCausalLM.from_pretrained("m", **kw)
            return FSDP(model)
        """)
    assert got == []


def test_no_path_dispatching_gives_nothing(tmp_path):
    got = fsdp009(tmp_path, """
        def build(cfg):
            kw = dict(torch_dtype=torch.bfloat16, device_map=None)
            if cfg.fp16:
                kw["torch_dtype"] = torch.float16
            model = AutoModelForCausalLM.from_pretrained("m", **kw)
            return FSDP(model)
        """)
    assert got == []
