"""A settings dict as users build it: a literal or `dict(...)` later changed by `d[key] = v` or
`d.update(...)`, read where it is used (here the `fsdp_config` of TrainingArguments, whose
`fsdp_version: 2` makes the Trainer shard the 4-bit model with FSDP2: FSDP201)."""

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

SRC = """\
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments
from peft import LoraConfig, get_peft_model


def main(use_fsdp2=False):
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16,
                             bnb_4bit_quant_storage=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=8))
    cfg = {cfg}
{writes}
    args = TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap", fsdp_config=cfg)
    Trainer(model=model, args=args).train()
{after}

main({call})
"""


def fsdp2(tmp: Path, cfg: str, writes: str = "", after: str = "", call: str = "") -> bool:
    """Whether the Trainer is found to shard the 4-bit model with FSDP2 (a decided FSDP201)."""
    (tmp / "pyproject.toml").write_text("[project]\nname = 'job'\n")
    (tmp / "train.py").write_text(SRC.format(cfg=cfg, writes=textwrap.indent(writes, "    "), after=after, call=call))
    r = CliRunner().invoke(main, ["check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                                  *TARGETS, str(tmp / "train.py")])
    assert r.exit_code == 0, r.output
    return [f["code"] for f in json.loads(r.stdout) if decided(f)] == ["FSDP201"]


@pytest.mark.parametrize("cfg, writes, expected", [
    ('{"fsdp_version": 1}', "", False),
    ('{"fsdp_version": 2}', "", True),
    ('{"fsdp_version": 1}', 'cfg["fsdp_version"] = 2', True),
    ('dict(fsdp_version=1)', 'cfg["fsdp_version"] = 2', True),
    ('{"fsdp_version": 1}', "cfg.update(fsdp_version=2)", True),
    ('{"fsdp_version": 1}', 'cfg.update({"fsdp_version": 2})', True),
    ('{"fsdp_version": 2}', 'cfg["fsdp_version"] = 1', False),
    ('{}', 'cfg["fsdp_version"] = 2', True),
    ('{"fsdp_version": 2}', 'cfg["fsdp_version"] = 1\ncfg["fsdp_version"] = 2', True),
    # Decided by the helper's argument: `main()` passes nothing, so the default False holds.
    ('{"fsdp_version": 1}', 'if use_fsdp2:\n    cfg["fsdp_version"] = 2', False),
], ids=["literal-1", "literal-2", "set", "dict-call-set", "update-kw", "update-dict", "set-back", "empty-set",
        "last-write-wins", "dead-branch"])
def test_writes_before_the_use_decide_the_value(tmp_path, cfg, writes, expected):
    assert fsdp2(tmp_path, cfg, writes) is expected


def test_a_branch_the_call_switches_on(tmp_path):
    assert fsdp2(tmp_path, '{"fsdp_version": 1}', 'if use_fsdp2:\n    cfg["fsdp_version"] = 2', call="use_fsdp2=True")


def test_a_write_after_the_use_does_not_count(tmp_path):
    assert not fsdp2(tmp_path, '{"fsdp_version": 1}', after='    cfg["fsdp_version"] = 2')
