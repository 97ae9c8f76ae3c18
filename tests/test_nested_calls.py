"""A call written inside another (`FSDP(AutoModel.from_pretrained(...))`, `fully_shard(get_peft_model(...))`)
stands for an object: the model the inner library call returns, or the unnamed model a load makes. Rules see
the load and the wrap as events on one model whatever the nesting, naming or returning."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

HEAD = """
    import os
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, fully_shard
"""

DISPATCHED = {
    "wrapped in place": """
        model = FSDP(AutoModelForCausalLM.from_pretrained("m", device_map="auto"), use_orig_params=True)
    """,
    "returned wrapped from a helper": """
        def build(name):
            return FSDP(AutoModelForCausalLM.from_pretrained(name, device_map="auto"), use_orig_params=True)
        model = build("m")
    """,
    "sharded, returned, FSDP2": """
        def build(name):
            return fully_shard(AutoModelForCausalLM.from_pretrained(name, device_map="balanced"))
        model = build("m")
    """,
    "moved then wrapped": """
        model = FSDP(AutoModelForCausalLM.from_pretrained("m", device_map="auto").to(torch.bfloat16),
                     use_orig_params=True)
    """,
    "given LoRA inside the wrap": """
        def build(name, cfg):
            return FSDP(get_peft_model(AutoModelForCausalLM.from_pretrained(name, device_map="auto"), cfg),
                        use_orig_params=True)
        model = build("m", LoraConfig(r=8, target_modules=["q_proj"]))
    """,
}
NOT_DISPATCHED = {
    "one device per rank": """
        model = FSDP(AutoModelForCausalLM.from_pretrained("m", device_map={"": int(os.environ["LOCAL_RANK"])}),
                     use_orig_params=True)
    """,
    "the dispatched model is another one": """
        judge = AutoModelForCausalLM.from_pretrained("j", device_map="auto")
        def build(name):
            return FSDP(AutoModelForCausalLM.from_pretrained(name), use_orig_params=True)
        model = build("m")
    """,
}


def _lint(tmp_path: Path, body: str, select: str) -> list[tuple]:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(HEAD) + textwrap.dedent(body))
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--no-cache", "--select", f"{select},FSDP900",
                                  "--output-format", "json", str(path)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return sorted((f["code"], f["severity"]) for f in json.loads(r.stdout))


@pytest.mark.parametrize("shape", sorted(DISPATCHED))
def test_dispatched_load_inside_the_wrap_is_reported(tmp_path, shape):
    assert _lint(tmp_path, DISPATCHED[shape], "FSDP009") == [("FSDP009", "error")]


@pytest.mark.parametrize("shape", sorted(NOT_DISPATCHED))
def test_undispatched_or_other_model_is_not_reported(tmp_path, shape):
    assert _lint(tmp_path, NOT_DISPATCHED[shape], "FSDP009") == []


@pytest.mark.parametrize("nested", [
    # LoRA given inside the wrap, on an unnamed load: FSDP1's default use_orig_params=False and no policy
    # put the frozen base and the adapters in one FlatParameter.
    'model = FSDP(get_peft_model(AutoModelForCausalLM.from_pretrained("m"), LoraConfig(r=8, target_modules=["q_proj"])))',
    'def build(cfg):\n    return FSDP(get_peft_model(AutoModelForCausalLM.from_pretrained("m"), cfg))\nmodel = build(LoraConfig(r=8))',
])
def test_lora_on_an_unnamed_load_inside_an_fsdp1_wrap_mixes_requires_grad(tmp_path, nested):
    assert _lint(tmp_path, nested, "FSDP004") == [("FSDP004", "error")]
