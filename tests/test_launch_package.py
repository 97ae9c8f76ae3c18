"""The launch package: tool configs find the accelerate config a launch names through the one shell reader
(variables, `--opt=value`, `cd`, documented commands), never through a second, looser reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsdplint.launch.tools.launchers import accelerate_configs_named_by, configs_for, launch_lines

FSDP1 = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\nnum_processes: 4\n"


def _project(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "proj"
    (root / ".git").mkdir(parents=True)
    (root / "configs").mkdir()
    (root / "configs" / "fsdp.yaml").write_text(FSDP1)
    (root / "train.py").write_text("print('train')\n")
    (root / "job.yaml").write_text("model_name_or_path: m\n")
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    launch_lines.cache_clear()
    return root


@pytest.mark.parametrize("launcher", [
    # A variable set earlier in the script.
    ("run.sh", "CFG=configs/fsdp.yaml\naccelerate launch --config_file $CFG train.py job.yaml\n"),
    # `--config-file=PATH` spelled with a dash and an equals sign, over continuation lines.
    ("run.sh", "accelerate launch \\\n  --config-file=configs/fsdp.yaml \\\n  train.py job.yaml\n"),
    # The launcher changes directory first: paths are resolved from there.
    ("scripts/run.sh", "cd ..\naccelerate launch --config_file configs/fsdp.yaml train.py job.yaml\n"),
    # A command documented in the README rather than written in a shell script.
    ("README.md", "# Train\n\n```bash\naccelerate launch --config_file configs/fsdp.yaml train.py job.yaml\n```\n"),
])
def test_the_accelerate_config_a_launch_names_is_found_in_each_shape(tmp_path, launcher):
    root = _project(tmp_path, dict([launcher]))
    cfg = root / "configs" / "fsdp.yaml"
    assert [p.resolve() for p in accelerate_configs_named_by(root)] == [cfg]
    # ... and it is bound to the files named on the same command line.
    assert [p.resolve() for p in configs_for(root / "job.yaml", root)] == [cfg]
    assert [p.resolve() for p in configs_for(root / "train.py", root)] == [cfg]


@pytest.mark.parametrize("text", [
    # `--config_file` of another program is not an accelerate config.
    "python tools/convert.py --config_file configs/fsdp.yaml\n",
    # A directory the reader cannot know: no file is guessed.
    "accelerate launch --config_file $CONFIG_DIR/fsdp.yaml train.py job.yaml\n",
    # A comment is not a command.
    "# accelerate launch --config_file configs/fsdp.yaml train.py job.yaml\n",
])
def test_no_config_is_named_where_no_accelerate_launch_names_one(tmp_path, text):
    root = _project(tmp_path, {"run.sh": text})
    assert accelerate_configs_named_by(root) == []
    assert configs_for(root / "job.yaml", root) == []


# -- launchers that run a script through another program ----------------------------------------------------
from fsdplint.launch.shell import launches_for, parse_launches  # noqa: E402


@pytest.mark.parametrize("cmd,launcher,script,module,args", [
    # llm-foundry's README: composer's launcher runs the script with a positional recipe and overrides.
    ("composer scripts/train/train.py yamls/ft.yaml", "composer", "scripts/train/train.py", None, ["yamls/ft.yaml"]),
    ("composer -n 8 --world_size 16 --master_addr $ADDR train.py ft.yaml max_seq_len=2048", "composer", "train.py",
     None, ["ft.yaml", "max_seq_len=2048"]),
    ("composer -m llmfoundry.train ft.yaml", "composer", None, "llmfoundry.train", ["ft.yaml"]),
    ("composer --module_mode llmfoundry.train ft.yaml", "composer", None, "llmfoundry.train", ["ft.yaml"]),
    # Command mode runs its own command: that command is the launch.
    ("composer -c python train.py ft.yaml", "python", "train.py", None, ["ft.yaml"]),
    # A program that runs the command after `--`.
    ("kubectl exec pod -- torchrun --nproc_per_node 8 train.py --bf16", "torchrun", "train.py", None, ["--bf16"]),
    ("ray job submit --address http://head:8265 -- python train.py", "python", "train.py", None, []),
    # Cluster process managers in front of the interpreter.
    ("horovodrun -np 4 python train.py", "python", "train.py", None, []),
    ("jsrun -n 2 -a 6 python train.py --bf16", "python", "train.py", None, ["--bf16"]),
    ("mpirun -np 8 python train.py", "python", "train.py", None, []),
    ("python -m torch.distributed.run --standalone --nproc_per_node 2 train.py", "torchrun", "train.py", None, []),
])
def test_a_launcher_that_runs_the_script_through_another_program(cmd, launcher, script, module, args):
    (launch,) = parse_launches(cmd, "run.sh")
    assert (launch.launcher, launch.script, launch.module, [a.text for a in launch.args]) == (
        launcher, script, module, args)


@pytest.mark.parametrize("cmd", ["git log -- train.py", "composer --version", "echo composer train.py"])
def test_a_command_that_only_names_a_script_launches_nothing(cmd):
    assert parse_launches(cmd, "run.sh") == []


def test_a_composer_launch_binds_to_the_script_it_names_with_its_recipe(tmp_path):
    root = _project(tmp_path, {
        "scripts/train/train.py": "import sys\nprint(sys.argv[1])\n",
        "scripts/train/yamls/ft.yaml": "fsdp_config:\n  sharding_strategy: FULL_SHARD\n",
        "scripts/train/run.sh": "cd \"$(dirname \"$0\")\"\ncomposer train.py yamls/ft.yaml\n",
        # Another folder's train.py is not launched by it.
        "examples/train.py": "print('other')\n",
    })
    (launch,) = launches_for(root / "scripts" / "train" / "train.py")
    assert launch.launcher == "composer" and [a.text for a in launch.args] == ["yamls/ft.yaml"]
    assert launches_for(root / "examples" / "train.py") == []


# -- a lone recipe that fits the parser is a candidate launch ------------------------------------------------
import json  # noqa: E402
import textwrap  # noqa: E402

from click.testing import CliRunner  # noqa: E402

from fsdplint.cli import main  # noqa: E402

TARGETS = [
    "--target-version", "torch=2.6", "--target-version", "accelerate=1.15.0", "--target-version", "peft=0.21.2",
    "--target-version", "transformers=5.24.0", "--target-version", "bitsandbytes=0.50.2",
]
_TAIL = """\
quantization_config = None
if {quant} == "4bit":
    quantization_config = BitsAndBytesConfig(load_in_4bit=True)
model = AutoModelForCausalLM.from_pretrained({model}, quantization_config=quantization_config)
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={{LlamaDecoderLayer}})
model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
"""
_HEAD = """\
import functools
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
"""
# argparse: the recipe's keys are the parser's dests.
ARGPARSE = _HEAD + """\
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--model_name", default="m")
parser.add_argument("--quant", choices=["none", "4bit"], default="none")
parser.add_argument("--learning_rate", type=float, default=1e-4)
args = parser.parse_args()
""" + _TAIL.format(quant="args.quant", model="args.model_name")
# HfArgumentParser with the script's own dataclass.
HF_PARSER = _HEAD + """\
from dataclasses import dataclass
from transformers import HfArgumentParser

@dataclass
class ScriptArguments:
    model_name: str = "m"
    quant: str = "none"
    learning_rate: float = 1e-4

(script_args,) = HfArgumentParser(ScriptArguments).parse_args_into_dataclasses()
""" + _TAIL.format(quant="script_args.quant", model="script_args.model_name")
RECIPE = "model_name: m\nquant: 4bit\nlearning_rate: 0.0002\n"


def _lint_json(*args) -> list[dict]:
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--output-format", "json", *TARGETS,
                                  *map(str, args)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "repo"
    for rel, text in {"pyproject.toml": "[project]\nname = 'demo'\n", **files}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


@pytest.mark.parametrize("script", [ARGPARSE, HF_PARSER], ids=["argparse", "hfargumentparser"])
@pytest.mark.parametrize("where", ["train/qlora.yaml", "train/recipes/qlora/config.yaml", "configs/qlora.json"])
def test_a_lone_recipe_that_fits_the_parser_is_a_candidate_launch(tmp_path, script, where):
    recipe = RECIPE if where.endswith(".yaml") else json.dumps({"model_name": "m", "quant": "4bit",
                                                                 "learning_rate": 2e-4})
    root = _repo(tmp_path, {"train/train.py": script, where: recipe})
    (f,) = _lint_json(root / "train" / "train.py")
    assert f["code"] == "FSDP202" and f["severity"] == "warning"  # an inferred launch: never an error
    assert Path(where).name in f["message"] and "inferred" in f["message"]
    # The same values given by a launcher are an error of that launch.
    other = _repo(tmp_path / "launched", {"train/train.py": script, where: recipe,
                                          "train/run.sh": "python train.py --quant 4bit\n"})
    (g,) = _lint_json(other / "train" / "train.py")
    assert g["code"] == "FSDP202" and g["severity"] == "error" and "inferred" not in g["message"]


def test_a_recipe_whose_keys_only_partly_match_is_not_taken(tmp_path):
    partial = "quant: 4bit\ndataset: wikitext\nmax_steps: 100\nseed: 1\n"  # one key of four is the parser's
    root = _repo(tmp_path, {"train/train.py": ARGPARSE, "train/recipes/data.yaml": partial})
    assert _lint_json(root / "train" / "train.py") == []


def test_a_fitting_recipe_with_the_safe_values_gives_nothing(tmp_path):
    root = _repo(tmp_path, {"train/train.py": HF_PARSER, "train/qlora.yaml": RECIPE.replace("4bit", "none")})
    assert _lint_json(root / "train" / "train.py") == []


def test_a_recipe_a_launcher_names_is_not_lone(tmp_path):
    # Another script's launcher names the file: it is that launch's recipe, not a guess for this script.
    root = _repo(tmp_path, {"train/train.py": ARGPARSE, "train/qlora.yaml": RECIPE,
                            "other/run.sh": "python other.py ../train/qlora.yaml\n", "other/other.py": "print(1)\n"})
    assert _lint_json(root / "train" / "train.py") == []


def test_verbose_names_the_candidate_launch(tmp_path):
    root = _repo(tmp_path, {"train/train.py": ARGPARSE, "train/recipes/qlora/config.yaml": RECIPE})
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "-v", str(root / "train" / "train.py")])
    assert "candidates inferred from lone recipes" in r.output and "config.yaml" in r.output
