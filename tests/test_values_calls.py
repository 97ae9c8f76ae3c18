"""Values of calls users write around the settings: `getattr` with known strings, a method fetched with
`getattr`, and `.item()` chained on (or returned from) a call. Asserted through the CLI."""

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


def lint(tmp: Path, files: dict) -> list[tuple[str, int]]:
    """(code, row) of each finding on train.py."""
    (tmp / "pyproject.toml").write_text("[project]\nname = 'job'\n")
    for name, text in files.items():
        (tmp / name).write_text(textwrap.dedent(text))
    r = CliRunner().invoke(main, ["check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                                  *TARGETS, str(tmp / "train.py")])
    assert r.exit_code == 0, r.output
    return sorted((f["code"], f["location"]["row"]) for f in json.loads(r.stdout) if f["code"] != "FSDP003")


QLORA = """\
import argparse
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
p = argparse.ArgumentParser()
p.add_argument("--storage", default="bfloat16")
args = p.parse_args()
bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage={storage}, bnb_4bit_compute_dtype=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8))
model = FSDP(model, use_orig_params=True)
"""


@pytest.mark.parametrize("storage, launch, mismatch", [
    ('getattr(torch, "bfloat16")', "", False),
    ('getattr(torch, "float16")', "", True),
    ("getattr(torch, args.storage)", "", False),
    ("getattr(torch, args.storage)", "--storage uint8", True),
    ("getattr(torch, args.storage)", "--storage float32", True),
])
def test_getattr_of_torch_with_a_known_string_is_that_dtype(tmp_path, storage, launch, mismatch):
    """FSDP202: the 4-bit storage dtype must equal the model's dtype for FSDP1 to flatten the parameters."""
    found = lint(tmp_path, {"train.py": QLORA.format(storage=storage),
                            "run.sh": f"torchrun --nproc_per_node 8 train.py {launch}\n"})
    assert found == ([("FSDP202", 9)] if mismatch else [])


def test_getattr_of_an_unknown_string_decides_nothing(tmp_path):
    src = QLORA.format(storage="getattr(torch, name)").replace("args = p.parse_args()", "args = p.parse_args()\nname = input()")
    assert lint(tmp_path, {"train.py": src}) == []


LOOP = """\
import contextlib
import torch
from torch.distributed.fsdp import fully_shard


def train(model, loader):
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    for batch in loader:
        with {ctx}:
            model(batch).sum().backward()
"""


@pytest.mark.parametrize("ctx, crashes", [
    ("model.no_sync()", True),
    ('getattr(model, "no_sync")()', True),
    # The default is taken on an FSDP2 module, which has no `no_sync`: no AttributeError.
    ('getattr(model, "no_sync", contextlib.nullcontext)()', False),
])
def test_a_method_fetched_with_getattr_is_the_method(tmp_path, ctx, crashes):
    assert lint(tmp_path, {"train.py": LOOP.format(ctx=ctx)}) == ([("FSDP012", 11)] if crashes else [])


CLIP = """\
import torch
from torch.distributed.fsdp import fully_shard
{helper}

def train(model):
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    {use}
"""
HELPER_EXPR = "\ndef clip(m):\n    return torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)\n"
HELPER_NAME = "\ndef clip(m):\n    norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)\n    return norm\n"


@pytest.mark.parametrize("helper, use, partial", [
    ("", "print(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())", True),
    ("", "norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()", True),
    (HELPER_EXPR, "print(clip(model).item())", True),
    (HELPER_EXPR, "norm = clip(model)\n    print(norm.item())", True),
    (HELPER_NAME, "loss = clip(model).item()", True),
    ("", "print(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).full_tensor().item())", False),
    (HELPER_EXPR, "print(clip(model).full_tensor().item())", False),
])
def test_item_of_an_fsdp2_norm_chained_or_returned(tmp_path, helper, use, partial):
    """FSDP501: `.item()` of the DTensor norm reads this rank's partial norm, however the call is chained;
    the finding is on the line that calls `.item()`."""
    src = CLIP.format(helper=helper, use=use)
    row = next(i for i, line in enumerate(src.splitlines(), 1) if ".item()" in line)
    assert lint(tmp_path, {"train.py": src}) == ([("FSDP501", row)] if partial else [])
