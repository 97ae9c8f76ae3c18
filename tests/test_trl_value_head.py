"""trl's value-head models (PPO): `AutoModelForCausalLMWithValueHead.from_pretrained(...)` loads the wrapped
transformers model with the keywords it is given (8-bit, device_map) and, given `peft_config=`, prepares a
k-bit load for training and injects LoRA itself. The analysis reads the call as that load and those events."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main

FSDP_CONFIG = """
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: GPTNeoBlock
  fsdp_offload_params: true
num_processes: 2
"""


def _lint(root: Path, monkeypatch, script: str) -> dict[str, list]:
    files = {
        "pyproject.toml": "[project]\nname = 'ppo'\ndependencies = ['trl>=0.11', 'transformers>=4.40,<5', 'torch>=2.2']\n",
        "ppo/fsdp.yaml": FSDP_CONFIG,
        "ppo/train.py": script,
        "ppo/run.sh": "accelerate launch --config_file ppo/fsdp.yaml ppo/train.py\n",
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
    monkeypatch.chdir(root)
    r = CliRunner().invoke(main, ["check", ".", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    out: dict[str, list] = {}
    for f in json.loads(r.stdout):
        out.setdefault(f["code"], []).append((f["location"]["row"], f["severity"]))
    return out


def test_an_8bit_value_head_load_with_lora_under_fsdp(tmp_path, monkeypatch):
    found = _lint(tmp_path, monkeypatch, """
        from peft import LoraConfig
        from trl import AutoModelForCausalLMWithValueHead, PPOTrainer

        lora_config = LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM")
        model = AutoModelForCausalLMWithValueHead.from_pretrained(
            "EleutherAI/gpt-neo-1.3B",
            load_in_8bit=True,
            device_map="balanced",
            peft_config=lora_config,
        )
        trainer = PPOTrainer(config, model, ref_model=None, tokenizer=tokenizer)
        model.gradient_checkpointing_enable()
        """)
    assert ("FSDP203", "error") in {(c, s) for c, v in found.items() for _, s in v}, found
    assert [s for _, s in found.get("FSDP009", [])] == ["error"], found
    # The value head's k-bit preparation makes the inputs require grad: reentrant checkpointing works.
    assert "FSDP105" not in found, found


def test_a_value_head_built_in_a_helper_from_trls_ppo_module(tmp_path, monkeypatch):
    found = _lint(tmp_path, monkeypatch, """
        from peft import LoraConfig
        from transformers import BitsAndBytesConfig
        from trl.experimental.ppo import AutoModelForCausalLMWithValueHead


        def build(name, r):
            quant = BitsAndBytesConfig(load_in_8bit=True)
            return AutoModelForCausalLMWithValueHead.from_pretrained(
                name, quantization_config=quant, peft_config=LoraConfig(r=r, task_type="CAUSAL_LM"))


        model = build("EleutherAI/gpt-neo-1.3B", 8)
        """)
    assert [s for _, s in found.get("FSDP203", [])] == ["error"], found
    assert "FSDP009" not in found, found


def test_a_full_precision_value_head_without_device_map_is_silent(tmp_path, monkeypatch):
    found = _lint(tmp_path, monkeypatch, """
        from peft import LoraConfig
        from trl import AutoModelForCausalLMWithValueHead

        model = AutoModelForCausalLMWithValueHead.from_pretrained(
            "EleutherAI/gpt-neo-1.3B", peft_config=LoraConfig(r=16, task_type="CAUSAL_LM"))
        """)
    assert not {"FSDP203", "FSDP009", "FSDP104"} & set(found), found
