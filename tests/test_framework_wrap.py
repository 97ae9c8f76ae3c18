"""The FSDP wrap a framework does (accelerator.prepare, the Trainer, trl's trainers), judged with the job's plan:
the plan's source (an accelerate config named by the launcher, `--fsdp` flags, TrainingArguments in code), the
framework's own defaults at the version in force, and LoRA the trainer injects itself."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main

TORCH = ["--target-version", "torch=2.2.2"]


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))


def _lint(root: Path, monkeypatch, *extra: str) -> list[dict]:
    monkeypatch.chdir(root)
    r = CliRunner().invoke(main, ["check", ".", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
                                  *extra], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _codes(found, code):
    """(file relative to the linted root, line, severity) of each finding of `code` (a launch config the
    launcher names is reported under the path it resolves to)."""
    root = str(Path.cwd().resolve()) + "/"
    return [(f["filename"].removeprefix(root), f["location"]["row"], f["severity"]) for f in found
            if f["code"] == code]


# A helper module returns the base model and the LoRA config; the script hands both to SFTTrainer, which
# injects LoRA itself; accelerate's config (named by the launcher) sets the FSDP1 plan.
SFT_TREE = {
    "pyproject.toml": "[project]\nname = 'sft'\n",
    "sft/utils.py": """
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM


        def create_and_prepare_model(model_args):
            model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
            peft_config = None
            if model_args.use_peft_lora:
                peft_config = LoraConfig(r=model_args.lora_r, target_modules=model_args.lora_target_modules.split(","))
            return model, peft_config
        """,
    "sft/train.py": """
        from dataclasses import dataclass, field

        from transformers import HfArgumentParser, TrainingArguments
        from trl import SFTTrainer

        from utils import create_and_prepare_model


        @dataclass
        class ModelArguments:
            model_name_or_path: str = field(default="meta-llama/Llama-2-7b-hf")
            use_peft_lora: bool = field(default=False)
            lora_r: int = field(default=8)
            lora_target_modules: str = field(default="q_proj,v_proj")


        def main(model_args, training_args):
            model, peft_config = create_and_prepare_model(model_args)
            trainer = SFTTrainer(model=model, args=training_args, peft_config=peft_config)
            trainer.train()


        if __name__ == "__main__":
            parser = HfArgumentParser((ModelArguments, TrainingArguments))
            model_args, training_args = parser.parse_args_into_dataclasses()
            main(model_args, training_args)
        """,
    "sft/fsdp.yaml": """
        distributed_type: FSDP
        fsdp_config:
          fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
          fsdp_sharding_strategy: FULL_SHARD
          fsdp_use_orig_params: false
        mixed_precision: bf16
        num_processes: 8
        """,
    "sft/run.sh": """
        accelerate launch --config_file sft/fsdp.yaml sft/train.py --use_peft_lora True --output_dir out
        """,
}


def test_sft_trainer_given_a_helpers_peft_config_under_an_accelerate_fsdp1_config(tmp_path, monkeypatch):
    _write(tmp_path, SFT_TREE)
    found = _lint(tmp_path, monkeypatch, *TORCH, "--target-version", "transformers=4.38.2")
    # (a warning: the helper of another module returns peft_config, whose value the analysis does not follow)
    assert _codes(found, "FSDP004") == [("sft/fsdp.yaml", 5, "warning")], found
    assert "peft_config" in next(f["message"] for f in found if f["code"] == "FSDP004")
    # From transformers 4.39 the Trainer gives a PEFT model peft's policy: the same job wraps.
    found = _lint(tmp_path, monkeypatch, *TORCH, "--target-version", "transformers=4.39.0")
    assert not _codes(found, "FSDP004"), found


def test_the_same_job_with_use_orig_params_true_or_without_lora_is_silent(tmp_path, monkeypatch):
    _write(tmp_path, {**SFT_TREE, "sft/fsdp.yaml": SFT_TREE["sft/fsdp.yaml"].replace("false", "true")})
    assert not _codes(_lint(tmp_path, monkeypatch, *TORCH, "--target-version", "transformers=4.38.2"), "FSDP004")
    # The launch does not turn LoRA on: the helper returns peft_config=None, SFTTrainer trains every parameter
    # (not followed through the helper's return: at most a warning, never an error).
    _write(tmp_path, {**SFT_TREE, "sft/run.sh": SFT_TREE["sft/run.sh"].replace("--use_peft_lora True ", "")})
    found = _codes(_lint(tmp_path, monkeypatch, *TORCH, "--target-version", "transformers=4.38.2"), "FSDP004")
    assert all(sev == "warning" for _, _, sev in found), found


# The Trainer's own FSDP options on a torchrun line: `--fsdp "full_shard auto_wrap"`; LoRA by get_peft_model.
TRAINER_TREE = {
    "pyproject.toml": "[project]\nname = 'lora'\n",
    "train_lora.py": """
        from dataclasses import dataclass

        import transformers
        from peft import LoraConfig, get_peft_model
        from transformers import Trainer


        @dataclass
        class ModelArguments:
            model_name_or_path: str = "huggyllama/llama-7b"


        def train():
            parser = transformers.HfArgumentParser((ModelArguments, transformers.TrainingArguments))
            model_args, training_args = parser.parse_args_into_dataclasses()
            model = transformers.LlamaForCausalLM.from_pretrained(model_args.model_name_or_path)
            model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
            trainer = Trainer(model=model, args=training_args)
            trainer.train()


        if __name__ == "__main__":
            train()
        """,
    "run.sh": """
        torchrun --nproc_per_node=4 train_lora.py --output_dir out \\
            --fsdp "full_shard auto_wrap" --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer
        """,
}


def test_trainer_fsdp_flags_use_the_trainers_use_orig_params_default_at_the_version(tmp_path, monkeypatch):
    _write(tmp_path, TRAINER_TREE)
    # transformers 4.35: the Trainer's FSDP1 passes use_orig_params=False unless fsdp_config says otherwise.
    found = _codes(_lint(tmp_path, monkeypatch, *TORCH, "--target-version", "transformers=4.35.2"), "FSDP004")
    assert found == [("run.sh", 2, "error")], found
    # 4.36 and later default it to True: on torch >= 2.1 a unit may mix frozen and trainable parameters.
    assert not _codes(_lint(tmp_path, monkeypatch, *TORCH, "--target-version", "transformers=4.36.0"), "FSDP004")
    # On torch 2.0 that is no escape (pytorch#100945).
    found = _lint(tmp_path, monkeypatch, "--target-version", "torch=2.0.1", "--target-version", "transformers=4.36.0")
    assert _codes(found, "FSDP004") == [("run.sh", 2, "error")], found


def test_the_trainers_fsdp_config_given_on_the_launch_decides_use_orig_params(tmp_path, monkeypatch):
    _write(tmp_path, {**TRAINER_TREE, "fsdp.json": '{"use_orig_params": true}\n',
                      "run.sh": TRAINER_TREE["run.sh"].replace("LlamaDecoderLayer", "LlamaDecoderLayer --fsdp_config fsdp.json")})
    assert not _codes(_lint(tmp_path, monkeypatch, *TORCH, "--target-version", "transformers=4.35.2"), "FSDP004")


def test_accelerator_prepare_in_a_trainer_class_under_the_default_accelerate_policy(tmp_path, monkeypatch):
    _write(tmp_path, {
        "pyproject.toml": "[project]\nname = 'loop'\n",
        "loop.py": """
            from accelerate import Accelerator
            from peft import LoraConfig, get_peft_model


            class Runner:
                def __init__(self, model):
                    self.accelerator = Accelerator()
                    self.model = get_peft_model(model, LoraConfig(r=4, target_modules=["c_attn"]))

                def setup(self, optimizer):
                    self.model, self.optimizer = self.accelerator.prepare(self.model, optimizer)
            """,
        # No policy named: accelerate's plugin defaults to NO_WRAP, one root unit over every parameter.
        "fsdp.yaml": "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n",
        "run.sh": "accelerate launch --config_file fsdp.yaml loop.py\n",
    })
    # (the config names nothing that decides it: reported at the wrap)
    found = _codes(_lint(tmp_path, monkeypatch, *TORCH), "FSDP004")
    assert found == [("loop.py", 11, "error")], found
