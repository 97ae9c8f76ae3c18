"""FSDP202 when `bnb_4bit_quant_storage` is set but the declared or installed bitsandbytes (< 0.43.0) or
transformers (< 4.39.0) is too old to honour it: the weights keep uint8 storage. The versions come from where
users declare them (a requirements pin, a pyproject dependency, --target-version); current libraries stay
silent."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

SCRIPTS = {
    "literal storage": """
        import torch
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
        model = FSDP(model, use_orig_params=True)
    """,
    "storage from a parsed flag through getattr": """
        import argparse
        import torch
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        p = argparse.ArgumentParser()
        p.add_argument("--storage", default="bfloat16")
        args = p.parse_args()
        dtype = getattr(torch, args.storage)
        model = AutoModelForCausalLM.from_pretrained(
            "m", quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=dtype),
            torch_dtype=dtype)
        model = FSDP(model, use_orig_params=True)
    """,
    "helper building the config, Trainer with fsdp": """
        import torch
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

        def quant(dtype):
            return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=dtype)

        model = AutoModelForCausalLM.from_pretrained("m", quantization_config=quant(torch.bfloat16),
                                                     torch_dtype=torch.bfloat16)
        Trainer(model=model, args=TrainingArguments("out", fsdp="full_shard auto_wrap")).train()
    """,
}
PINS = {
    "requirements pin": ({"requirements.txt": "bitsandbytes==0.41.1\ntransformers==4.42.4\n"}, []),
    "pyproject dependency": ({"pyproject.toml": '[project]\nname = "job"\nversion = "0.1"\n'
                                                'dependencies = ["transformers==4.38.2", "bitsandbytes==0.43.1"]\n'}, []),
    # (transformers 4.x: the Trainer's `fsdp=` is FSDP1 there; from 5.10 it means FSDP2, FSDP201's case.)
    "--target-version": ({}, ["--target-version", "bitsandbytes=0.42.0", "--target-version", "transformers=4.46.0"]),
}


def _lint(tmp_path: Path, script: str, files: dict, args: list) -> list[tuple]:
    root = tmp_path / "job"
    (root / ".git").mkdir(parents=True)
    (root / "train.py").write_text(textwrap.dedent(script))
    for name, text in files.items():
        (root / name).write_text(text)
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--no-cache", "--select", "FSDP202,FSDP900",
                                  "--output-format", "json", *args, str(root / "train.py")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return [(f["code"], f["severity"], "ignores it" in f["message"]) for f in json.loads(r.stdout)]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("pin", sorted(PINS))
def test_storage_ignored_by_an_old_library_is_reported(tmp_path, script, pin):
    files, args = PINS[pin]
    assert _lint(tmp_path, SCRIPTS[script], files, args) == [("FSDP202", "error", True)]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_current_libraries_honour_the_storage(tmp_path, script):
    files = {"requirements.txt": "bitsandbytes>=0.43.3\ntransformers>=4.45\n"}
    assert _lint(tmp_path, SCRIPTS[script], files, ["--target-version", "bitsandbytes=0.45.0",
                                                    "--target-version", "transformers=4.46.0"]) == []
