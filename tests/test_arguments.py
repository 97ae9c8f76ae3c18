"""Command-line arguments to values: argparse, HfArgumentParser/TrlParser dataclasses, recipe files."""

from __future__ import annotations

import textwrap

import pytest

from fsdplint.analysis import UNKNOWN
from fsdplint.launch.arguments import bind, library_fields, parse_definitions
from fsdplint.launch.shell import parse_launches


def _env(src: str, cmd: str | None = None, dirs=(), use_installed: bool = True):
    defs = parse_definitions(textwrap.dedent(src), use_installed)
    assert defs is not None
    launch = parse_launches(cmd, "run.sh")[0] if cmd else None
    return bind(defs, launch, tuple(str(d) for d in dirs))


ARGPARSE = """
import argparse

def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--load_in_4bit", action="store_true")
    p.add_argument("--no-sync", dest="sync", action="store_false")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--targets", nargs="+", default=["q_proj"])
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False)
    return p.parse_args()

args = parse_args()
"""


def _v(env, dotted):
    return env.lookup(dotted).values


def test_argparse_defaults():
    env = _env(ARGPARSE)
    assert _v(env, "args.load_in_4bit") == (False,)
    assert _v(env, "args.sync") == (True,)
    assert _v(env, "args.lora_r") == (16,)
    assert _v(env, "args.dtype") == ("bf16",)
    assert _v(env, "args.targets") == (["q_proj"],)
    assert env.lookup("args.load_in_4bit").origin.describe() == "its default, line 6"
    assert _v(env, "args.not_defined") == (UNKNOWN,)


def test_argparse_launch_values_and_lines():
    env = _env(ARGPARSE, "python train.py --load_in_4bit --no-sync \\\n  --lora-r=64 --dtype fp16 --targets q_proj v_proj --no-compile\n")
    assert _v(env, "args.load_in_4bit") == (True,)
    assert _v(env, "args.sync") == (False,)
    assert _v(env, "args.lora_r") == (64,)
    assert _v(env, "args.dtype") == ("fp16",)
    assert _v(env, "args.targets") == (["q_proj", "v_proj"],)
    assert _v(env, "args.compile") == (False,)
    assert env.lookup("args.lora_r").origin.describe() == "set by run.sh:2"


def test_dollar_at_leaves_unset_flags_open():
    env = _env(ARGPARSE, 'python train.py --lora-r 8 "$@"\n')
    assert _v(env, "args.lora_r") == (8,)
    assert set(_v(env, "args.load_in_4bit")) == {False, UNKNOWN}


HF = """
from dataclasses import dataclass, field
from typing import Optional
from transformers import HfArgumentParser, TrainingArguments

@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="m")
    load_in_4bit: bool = field(default=False)
    use_peft: Optional[bool] = True
    lora_target_modules: Optional[list[str]] = None

parser = HfArgumentParser((ModelArguments, TrainingArguments))
model_args, training_args = parser.parse_args_into_dataclasses()
"""


def test_hf_argument_parser_user_and_library_dataclasses():
    env = _env(HF, 'torchrun train.py --load_in_4bit --no_use_peft --lora_target_modules q_proj k_proj '
                   '--fsdp "full_shard auto_wrap" --gradient_checkpointing false\n')
    assert _v(env, "model_args.load_in_4bit") == (True,)
    assert _v(env, "model_args.use_peft") == (False,)
    assert _v(env, "model_args.lora_target_modules") == (["q_proj", "k_proj"],)
    assert _v(env, "training_args.fsdp") == ("full_shard auto_wrap",)
    assert _v(env, "training_args.gradient_checkpointing") == (False,)
    assert dict((k, v.values) for k, v in env.training) == {"fsdp": ("full_shard auto_wrap",),
                                                             "gradient_checkpointing": (False,)}


def test_library_fields_from_installed_source_and_from_the_table():
    installed = library_fields("transformers.TrainingArguments", use_installed=True)
    table = library_fields("transformers.TrainingArguments", use_installed=False)
    # the installed transformers source has hundreds of fields; the shipped table only those the rules read
    assert len(installed) > 100 and "fsdp" in installed and installed["bf16"].default is False
    assert set(table) < set(installed) and table["fsdp"].default is None
    model = library_fields("trl.ModelConfig", use_installed=False)
    assert model["load_in_4bit"].default is False and model["lora_target_modules"].kind == "list"


def test_trl_parser_recipe_yaml(tmp_path):
    (tmp_path / "recipe.yaml").write_text("model_name_or_path: m\nload_in_4bit: true\nfsdp: full_shard auto_wrap\nlora_r: 8\n")
    src = """
    from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser
    parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    """
    env = _env(src, "accelerate launch sft.py --config recipe.yaml --lora_r 32\n", dirs=[tmp_path], use_installed=False)
    assert _v(env, "model_args.load_in_4bit") == (True,)
    assert _v(env, "model_args.lora_r") == (32,)  # the command line wins over the recipe
    assert env.lookup("model_args.load_in_4bit").origin.describe() == f"set by {env.lookup('model_args.load_in_4bit').origin.file}:2"
    assert _v(env, "training_args.fsdp") == ("full_shard auto_wrap",)
    assert _v(env, "training_args.gradient_checkpointing") == (True,)  # SFTConfig's own default


def test_parse_yaml_file_first_argument(tmp_path):
    (tmp_path / "config.yaml").write_text("load_in_4bit: true\n")
    src = """
    import sys
    from transformers import HfArgumentParser
    from dataclasses import dataclass

    @dataclass
    class Args:
        load_in_4bit: bool = False

    parser = HfArgumentParser(Args)
    if sys.argv[1].endswith(".yaml"):
        (args,) = parser.parse_yaml_file(sys.argv[1])
    else:
        (args,) = parser.parse_args_into_dataclasses()
    """
    assert _v(_env(src), "args.load_in_4bit") == (False,)
    assert _v(_env(src, "python train.py config.yaml\n", dirs=[tmp_path]), "args.load_in_4bit") == (True,)


def test_no_parser_no_definitions():
    assert parse_definitions("import torch\nx = 1\n") is None


def test_recipe_path_written_in_the_script(tmp_path):
    (tmp_path / "args.json").write_text('{\n  "load_in_4bit": true\n}\n')
    src = """
    from transformers import HfArgumentParser
    from dataclasses import dataclass

    @dataclass
    class Args:
        load_in_4bit: bool = False

    (args,) = HfArgumentParser(Args).parse_json_file("args.json")
    """
    env = _env(src, dirs=[tmp_path])
    assert _v(env, "args.load_in_4bit") == (True,)
    assert env.lookup("args.load_in_4bit").origin.line == 2


def test_alignment_handbook_layout(tmp_path):
    (tmp_path / "recipe.yaml").write_text("load_in_4bit: true\nuse_peft: true\ngradient_checkpointing: true\n")
    src = """
    from alignment import H4ArgumentParser, ModelArguments, DataArguments, SFTConfig
    parser = H4ArgumentParser((ModelArguments, DataArguments, SFTConfig))
    model_args, data_args, training_args = parser.parse()
    """
    env = _env(src, "accelerate launch run_sft.py recipe.yaml --lora_r=64\n", dirs=[tmp_path], use_installed=False)
    assert _v(env, "model_args.load_in_4bit") == (True,) and _v(env, "model_args.lora_r") == (64,)
    assert _v(env, "training_args.gradient_checkpointing") == (True,)


def test_one_dataclass_taken_by_index():
    """`script_args = parser.parse_args_into_dataclasses()[0]` (trl's stack_llama_2 scripts): the first group."""
    src = """
    from dataclasses import dataclass, field
    from transformers import HfArgumentParser, TrainingArguments

    @dataclass
    class ScriptArguments:
        load_in_4bit: bool = field(default=True)

    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    script_args = parser.parse_args_into_dataclasses()[0]
    training_args = parser.parse_args_into_dataclasses()[1]
    """
    env = _env(src, use_installed=False)
    assert _v(env, "script_args.load_in_4bit") == (True,)
    assert env.lookup("training_args.load_in_4bit") != env.lookup("script_args.load_in_4bit")
    env = _env(src, "python dpo.py --load_in_4bit False\n", use_installed=False)
    assert _v(env, "script_args.load_in_4bit") == (False,)


# -- argument dataclasses in other modules of the project ---------------------------------------------------

CONFIGS = """
from dataclasses import dataclass, field
from typing import Optional
import transformers

__all__ = ["ModelArguments", "TrainingArguments"]


@dataclass
class ModelArguments:
    model_name_or_path: Optional[str] = field(default="m")
    load_in_4bit: bool = field(default=False)


@dataclass
class TrainingArguments(transformers.TrainingArguments):
    max_seq_length: int = field(default=1024)


@dataclass
class _Hidden:
    load_in_4bit: bool = True
"""


def _project_env(tmp_path, files: dict[str, str], script: str, cmd: str | None = None):
    from fsdplint.analysis.index import Project

    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    path = (tmp_path / script).resolve()
    defs = parse_definitions(path.read_text(), False, Project(tmp_path.resolve()).find_module, path)
    if defs is None:
        return None
    launch = parse_launches(cmd, "run.sh")[0] if cmd else None
    return bind(defs, launch, (str(tmp_path),))


@pytest.mark.parametrize("imports, parser", [
    # module.Class on an imported module, the classes given as `dataclass_types=`
    ("from tuning.config import configs", "transformers.HfArgumentParser(dataclass_types=(configs.ModelArguments, configs.TrainingArguments))"),
    ("import tuning.config.configs as configs", "transformers.HfArgumentParser([configs.ModelArguments, configs.TrainingArguments])"),
    ("from .config import configs", "transformers.HfArgumentParser(dataclass_types=[configs.ModelArguments, configs.TrainingArguments])"),
    ("from .config.configs import ModelArguments, TrainingArguments", "transformers.HfArgumentParser((ModelArguments, TrainingArguments))"),
    ("from tuning.config.configs import *", "transformers.HfArgumentParser((ModelArguments, TrainingArguments))"),
])
def test_dataclasses_of_another_project_module(tmp_path, imports, parser):
    script = f"""
    import transformers
    {imports}

    def main():
        model_args, training_args = {parser}.parse_args_into_dataclasses()
    """
    files = {"tuning/__init__.py": "", "tuning/config/__init__.py": "", "tuning/config/configs.py": CONFIGS,
             "tuning/sft.py": script}
    env = _project_env(tmp_path, files, "tuning/sft.py",
                       'torchrun tuning/sft.py --load_in_4bit True --fsdp "full_shard auto_wrap" --max_seq_length 8\n')
    assert env is not None
    assert _v(env, "model_args.load_in_4bit") == (True,)
    assert _v(env, "training_args.max_seq_length") == (8,)
    # the project's TrainingArguments subclasses transformers': the launch's --fsdp is a training fact
    assert dict((k, v.values) for k, v in env.training)["fsdp"] == ("full_shard auto_wrap",)


def test_a_star_import_does_not_bind_what_dunder_all_leaves_out(tmp_path):
    script = """
    from transformers import HfArgumentParser
    from configs import *

    (hidden,) = HfArgumentParser(_Hidden).parse_args_into_dataclasses()
    (model_args,) = HfArgumentParser(ModelArguments).parse_args_into_dataclasses()
    """
    env = _project_env(tmp_path, {"configs.py": CONFIGS, "sft.py": script}, "sft.py")
    assert _v(env, "model_args.load_in_4bit") == (False,)  # exported: its default is read
    # _Hidden is not in __all__, so the star import does not bind it: its default (True) is not the script's
    assert _v(env, "hidden.load_in_4bit") == (UNKNOWN,)
