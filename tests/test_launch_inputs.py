"""Launch facts written outside the linted script: a checkout without project markers linted as `fsdplint .`,
argument dataclasses of the project's own package, fire command lines, another module's branches on the
parsed arguments, requirements pins at the top of a copied tree, and mmengine-style config files.

Everything goes through the real CLI, on trees written to a temporary directory.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.launch.arguments import fire_value
from fsdplint.cli import main
from fsdplint.versions import project_dirs

PINNED = ["--target-version", "torch=2.6", "--target-version", "accelerate=1.15.0",
          "--target-version", "transformers=5.24.0", "--target-version", "bitsandbytes=0.50.2"]


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


def _errors(found, code=None):
    return [f for f in found if f["severity"] == "error" and (code is None or f["code"] == code)]


FSDP1_YAML = """
distributed_type: FSDP
fsdp_config:
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
"""

# A package under src/ whose argument dataclass keeps the 4-bit storage default at uint8, and a helper that
# builds the quantization config from it; the script only parses and passes the arguments on.
RECIPE_TREE = {
    "src/recipes/__init__.py": "from .args import ModelArgs\nfrom .loading import quant_config\n",
    "src/recipes/args.py": """
        from dataclasses import dataclass, field
        from typing import Optional


        @dataclass
        class ModelArgs:
            model_name_or_path: Optional[str] = field(default=None)
            load_in_4bit: bool = field(default=False)
            load_in_8bit: bool = field(default=False)
            bnb_4bit_quant_storage: Optional[str] = field(default="uint8")
        """,
    "src/recipes/loading.py": """
        import torch
        from transformers import BitsAndBytesConfig


        def quant_config(model_args):
            if model_args.load_in_4bit:
                return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=model_args.bnb_4bit_quant_storage)
            elif model_args.load_in_8bit:
                return BitsAndBytesConfig(load_in_8bit=True)
            return None
        """,
    "tools/train.py": """
        from transformers import AutoModelForCausalLM, HfArgumentParser, TrainingArguments

        from recipes import ModelArgs, quant_config

        parser = HfArgumentParser((ModelArgs, TrainingArguments))
        model_args, training_args = parser.parse_yaml_file("job.yaml")
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path,
                                                     quantization_config=quant_config(model_args))
        """,
    "configs/fsdp.yaml": FSDP1_YAML,
}


def test_a_tree_without_markers_is_one_project_when_linted_as_a_directory(tmp_path, monkeypatch):
    # No pyproject.toml/.git anywhere: the launcher at the top, the script under tools/, the package under src/.
    _write(tmp_path, {**RECIPE_TREE,
                      "tools/job.yaml": "model_name_or_path: m\nload_in_4bit: true\n",
                      "go.sh": "accelerate launch --config_file configs/fsdp.yaml tools/train.py\n"})
    found = _errors(_lint(tmp_path, monkeypatch, *PINNED))
    assert [f["code"] for f in found] == ["FSDP202"], found
    f = found[0]
    # The faulty statement is the helper's, in a module linted too: reported there, the script's call related.
    assert (f["filename"], f["location"]["row"]) == ("src/recipes/loading.py", 7)
    assert "tools/train.py" in [r["filename"] for r in f["related"]]
    # The value comes from the dataclass default in the package.
    assert "uint8" in f["message"] and "its default" in f["message"], f["message"]
    # The 8-bit branch of the helper is ruled out by the recipe (load_in_8bit stays False): no FSDP203.
    assert not _errors(found, "FSDP203")


def test_the_storage_given_on_the_launch_line_clears_it(tmp_path, monkeypatch):
    _write(tmp_path, {**RECIPE_TREE,
                      "tools/job.yaml": "model_name_or_path: m\nload_in_4bit: true\nbnb_4bit_quant_storage: bfloat16\n",
                      "go.sh": "accelerate launch --config_file configs/fsdp.yaml tools/train.py\n"})
    assert _errors(_lint(tmp_path, monkeypatch, *PINNED)) == []


def test_the_8bit_branch_of_another_module_is_reported_when_the_recipe_takes_it(tmp_path, monkeypatch):
    _write(tmp_path, {**RECIPE_TREE,
                      "tools/job.yaml": "model_name_or_path: m\nload_in_8bit: true\n",
                      "go.sh": "accelerate launch --config_file configs/fsdp.yaml tools/train.py\n"})
    found = _errors(_lint(tmp_path, monkeypatch, *PINNED))
    assert [f["code"] for f in found] == ["FSDP203"], found


FIRE_SCRIPT = """
import fire
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoModelForCausalLM

from settings import TrainSettings


def apply(cfg, **overrides):
    for k, v in overrides.items():
        if hasattr(cfg, k):
            setattr(cfg, k, v)


def main(**kwargs):
    cfg = TrainSettings()
    apply(cfg, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(cfg.model, load_in_8bit=True if cfg.int8 else None)
    if cfg.shard:
        model = FSDP(model)


if __name__ == "__main__":
    fire.Fire(main)
"""
FIRE_SETTINGS = """
from dataclasses import dataclass


@dataclass
class TrainSettings:
    model: str = "m"
    int8: bool = False
    shard: bool = False
"""


def _fire_tree(tmp_path, flags: str) -> Path:
    _write(tmp_path, {"pyproject.toml": "[project]\nname = 'ft'\n", "finetune.py": FIRE_SCRIPT,
                      "settings.py": FIRE_SETTINGS, "run.sh": f"torchrun --nproc_per_node 2 finetune.py {flags}\n"})
    return tmp_path


def test_fire_flags_fill_the_config_the_keywords_are_handed_to(tmp_path, monkeypatch):
    found = _errors(_lint(_fire_tree(tmp_path, "--shard --int8"), monkeypatch, *PINNED))
    assert [f["code"] for f in found] == ["FSDP203"], found
    assert "run.sh" in found[0]["message"]


def test_fire_false_literal_turns_the_flag_off(tmp_path, monkeypatch):
    assert _errors(_lint(_fire_tree(tmp_path, "--shard --int8 False"), monkeypatch, *PINNED)) == []
    assert _errors(_lint(_fire_tree(tmp_path, "--shard --noint8"), monkeypatch, *PINNED)) == []


def test_fire_lowercase_false_is_a_truthy_string(tmp_path, monkeypatch):
    # fire parses `false` as the string "false": `if cfg.int8` still holds, so the 8-bit load happens.
    found = _errors(_lint(_fire_tree(tmp_path, "--shard --int8 false"), monkeypatch, *PINNED))
    assert [f["code"] for f in found] == ["FSDP203"], found


def test_fire_values_follow_fires_parser():
    assert fire_value("False") is False and fire_value("True") is True
    assert fire_value("false") == "false"
    assert fire_value("8bit") == "8bit"
    assert fire_value("4") == 4 and fire_value("1e-4") == 1e-4
    assert fire_value("[q_proj,v_proj]") == ["q_proj", "v_proj"]
    assert fire_value("a-b") == "a-b"  # a binary operation stays text


def test_requirements_at_the_top_of_a_copied_tree_are_the_projects(tmp_path):
    _write(tmp_path, {"copy/requirements.txt": "bitsandbytes==0.42.0\n", "copy/examples/qlora/run.sh": "echo\n"})
    dirs = project_dirs((tmp_path / "copy" / "examples" / "qlora").resolve())
    assert dirs[-1] == (tmp_path / "copy").resolve()
    # Without any requirements file, only the file's own directory counts.
    other = tmp_path / "elsewhere" / "deep"
    other.mkdir(parents=True)
    assert project_dirs(other.resolve()) == (other.resolve(),)


MMENGINE_CONFIG = """
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

model = dict(
    type=AutoModelForCausalLM.from_pretrained,
    pretrained_model_name_or_path="m",
    torch_dtype=torch.float16,
    quantization_config=dict(type=BitsAndBytesConfig, load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16{extra}),
)
model_wrapper_cfg = dict(type="MMFullyShardedDataParallel", use_orig_params=True)
"""


def test_an_mmengine_config_is_linted_as_the_calls_its_registry_makes(tmp_path, monkeypatch):
    _write(tmp_path, {"cfg.py": MMENGINE_CONFIG.format(extra="")})
    found = _errors(_lint(tmp_path, monkeypatch, *PINNED))
    assert [(f["code"], f["location"]["row"]) for f in found] == [("FSDP202", 8)], found
    _write(tmp_path, {"cfg.py": MMENGINE_CONFIG.format(extra=", bnb_4bit_quant_storage=torch.float16")})
    assert _errors(_lint(tmp_path, monkeypatch, *PINNED)) == []


DEVICE_MAP_TREE = {
    "loader.py": """
        from transformers import AutoModelForCausalLM


        def load(opts):
            device_map = None
            if opts.quantize:
                device_map = "auto"
            model = AutoModelForCausalLM.from_pretrained(opts.model, device_map=device_map)
            return model
        """,
    "train.py": """
        from dataclasses import dataclass

        from transformers import HfArgumentParser, Trainer, TrainingArguments

        from loader import load


        @dataclass
        class Opts:
            model: str = "m"
            quantize: bool = False


        opts, targs = HfArgumentParser((Opts, TrainingArguments)).parse_args_into_dataclasses()
        model = load(opts)
        Trainer(model=model, args=targs).train()
        """,
    "fsdp.yaml": FSDP1_YAML,
}


def test_a_helpers_assignment_in_a_branch_the_launch_takes_is_its_value(tmp_path, monkeypatch):
    _write(tmp_path, {**DEVICE_MAP_TREE, "run.sh": "accelerate launch --config_file fsdp.yaml train.py --quantize\n"})
    found = _errors(_lint(tmp_path, monkeypatch, *PINNED))
    assert [f["code"] for f in found] == ["FSDP009"], found
    # The helper's statement, in a module linted too, holds the finding (the script's call is related).
    assert (found[0]["filename"].rsplit("/", 1)[-1], found[0]["location"]["row"]) == ("loader.py", 8)


def test_a_helpers_branch_the_launch_does_not_take_stays_silent(tmp_path, monkeypatch):
    _write(tmp_path, {**DEVICE_MAP_TREE, "run.sh": "accelerate launch --config_file fsdp.yaml train.py\n"})
    assert _errors(_lint(tmp_path, monkeypatch, *PINNED)) == []


# A package whose TrainingArguments subclass lives in `pkg/config/configs.py`, reached as `configs.X` and given
# to the parser as `dataclass_types=`; a callback saves the adapter with save_pretrained in on_save.
CALLBACK_TREE = {
    "pkg/__init__.py": "",
    "pkg/config/__init__.py": "",
    "pkg/config/configs.py": """
        from dataclasses import dataclass, field
        import transformers


        @dataclass
        class ModelArguments:
            model_name_or_path: str = field(default="m")


        @dataclass
        class TrainingArguments(transformers.TrainingArguments):
            max_seq_length: int = field(default=1024)
        """,
    "pkg/sft.py": """
        import transformers
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, Trainer, TrainerCallback
        from pkg.config import configs


        class SaveAdapter(TrainerCallback):
            def on_save(self, args, state, control, **kwargs):
                kwargs["model"].save_pretrained(f"{args.output_dir}/adapter-{state.global_step}")


        def main():
            parser = transformers.HfArgumentParser(dataclass_types=(configs.ModelArguments, configs.TrainingArguments))
            model_args, training_args = parser.parse_args_into_dataclasses()
            model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
            model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
            Trainer(model=model, args=training_args, callbacks=[SaveAdapter()]).train()


        if __name__ == "__main__":
            main()
        """,
    "fsdp.json": '{"fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_use_orig_params": "true"}\n',
}


def test_the_launch_reaches_training_arguments_defined_in_another_module(tmp_path, monkeypatch):
    _write(tmp_path, CALLBACK_TREE)
    launch = 'torchrun --nproc_per_node 8 pkg/sft.py --fsdp "full_shard auto_wrap" --fsdp_config fsdp.json'
    found = _errors(_lint(tmp_path, monkeypatch, *PINNED, "--launch", launch), "FSDP402")
    assert [(f["filename"], f["location"]["row"]) for f in found] == [("pkg/sft.py", 9)], found
    # The same job launched without --fsdp: one process, nothing sharded, nothing to report.
    plain = _lint(tmp_path, monkeypatch, *PINNED, "--launch", "torchrun --nproc_per_node 1 pkg/sft.py")
    assert not _errors(plain, "FSDP402")
