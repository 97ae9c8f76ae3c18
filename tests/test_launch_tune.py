"""torchtune's `tune run` is a launcher: the recipe through the project's recipe registry (or a path), the
config name to its YAML under recipes/configs/, torchrun options making it a distributed launch."""

from __future__ import annotations

import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main
from fsdplint.launch.shell import launches_from_command, parse_launches

REGISTRY = """\
from dataclasses import dataclass


@dataclass
class Config:
    name: str
    file_path: str


@dataclass
class Recipe:
    name: str
    file_path: str
    configs: list
    supports_distributed: bool


_ALL_RECIPES = [
    Recipe(
        name="lora_finetune_distributed",
        file_path="lora_finetune_distributed.py",
        configs=[Config(name="llama2/7B_lora", file_path="llama2/7B_lora.yaml")],
        supports_distributed=True,
    ),
    Recipe(
        name="lora_finetune_fsdp2",
        file_path="dev/lora_finetune_fsdp2.py",
        configs=[Config(name="llama2/7B_qlora", file_path="dev/llama2/7B_qlora_fsdp2.yaml")],
        supports_distributed=True,
    ),
]
"""


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "torchtune-repo"
    for rel, text in {
        "pyproject.toml": "[project]\nname = 'torchtune'\n",
        "torchtune/__init__.py": "",
        "torchtune/_recipe_registry.py": REGISTRY,
        "recipes/lora_finetune_distributed.py": "def recipe_main(cfg):\n    pass\n",
        "recipes/dev/lora_finetune_fsdp2.py": "def recipe_main(cfg):\n    pass\n",
        "recipes/configs/llama2/7B_lora.yaml": "device: cuda\n",
        "recipes/configs/dev/llama2/7B_qlora_fsdp2.yaml": "device: cuda\n",
        "scripts/run.sh": "tune run --nproc_per_node 4 lora_finetune_fsdp2 --config llama2/7B_qlora max_steps=5\n",
    }.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def test_registry_names_bind_to_recipe_and_config_files(tmp_path, monkeypatch):
    root = _tree(tmp_path)
    monkeypatch.chdir(root)
    [l] = launches_from_command("tune run --nnodes 1 --nproc_per_node 2 lora_finetune_distributed "
                                "--config llama2/7B_lora enable_activation_checkpointing=False")
    assert l.launcher == "torchrun"
    assert Path(l.script) == root / "recipes/lora_finetune_distributed.py"
    words = [w.text for w in l.args]
    assert Path(words[1]) == root / "recipes/configs/llama2/7B_lora.yaml"
    assert words[2] == "enable_activation_checkpointing=False"


def test_launcher_file_reads_the_registry_of_its_repository(tmp_path):
    root = _tree(tmp_path)
    sh = root / "scripts/run.sh"
    [l] = parse_launches(sh.read_text(), "scripts/run.sh", str(sh))
    assert Path(l.script) == root / "recipes/dev/lora_finetune_fsdp2.py"
    assert Path(l.args[1].text) == root / "recipes/configs/dev/llama2/7B_qlora_fsdp2.yaml"


def test_single_process_and_path_recipes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    [l] = launches_from_command("tune run my_recipes/train.py --config my_recipes/train.yaml")
    assert (l.launcher, l.script) == ("python", "my_recipes/train.py")


def test_installed_recipe_is_a_notice_and_a_malformed_launch_is_a_usage_error(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("import torch\n")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["check", "--isolated", "--launch",
                                  "tune run --nproc_per_node 2 lora_finetune_distributed --config llama2/7B_lora",
                                  "train.py"])
    assert r.exit_code == 0, r.output
    assert "installed torchtune" in r.output
    r = CliRunner().invoke(main, ["check", "--isolated", "--launch", "echo hello", "train.py"])
    assert r.exit_code == 2


def _legacy_tree(tmp_path: Path) -> Path:
    """A torchtune checkout from before `tune run` and the recipe registry: recipes/NAME.py beside the package."""
    root = tmp_path / "torchtune-2024-03"
    for rel, text in {
        "setup.py": "from setuptools import setup\nsetup(name='torchtune', version='0.0.1')\n",
        "torchtune/__init__.py": "_RECIPE_LIST = ['lora_finetune_distributed.py']\n",
        "recipes/lora_finetune_distributed.py": "def recipe_main(cfg):\n    pass\n",
        "recipes/configs/llama2/7B_lora.yaml": "device: cuda\n",
        "docs/run.sh": "tune --nnodes 1 --nproc_per_node 8 lora_finetune_distributed --config llama2/7B_lora\n",
    }.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_tune_without_run_binds_as_it_did_before_tune_run(tmp_path, monkeypatch):
    root = _legacy_tree(tmp_path)
    monkeypatch.chdir(root)
    [l] = launches_from_command("tune --nnodes 1 --nproc_per_node 8 lora_finetune_distributed "
                                "--config llama2/7B_lora lora_rank=16")
    assert (l.launcher, Path(l.script)) == ("torchrun", root / "recipes/lora_finetune_distributed.py")
    assert Path(l.args[1].text) == root / "recipes/configs/llama2/7B_lora.yaml"
    assert l.args[2].text == "lora_rank=16"
    sh = root / "docs/run.sh"
    [l] = parse_launches(sh.read_text(), "docs/run.sh", str(sh))
    assert Path(l.script) == root / "recipes/lora_finetune_distributed.py"


def test_tune_subcommands_are_not_launches(tmp_path, monkeypatch):
    root = _legacy_tree(tmp_path)
    monkeypatch.chdir(root)
    for cmd in ("tune ls", "tune download meta-llama/Llama-2-7b-hf --output-dir ./llama",
                "tune cp llama2/7B_lora custom.yaml", "tune validate --config custom.yaml"):
        assert launches_from_command(cmd) == [], cmd


def test_tune_without_run_from_the_command_line_lints_the_recipe(tmp_path, monkeypatch):
    root = _legacy_tree(tmp_path)
    monkeypatch.chdir(root)
    r = CliRunner().invoke(main, ["check", "--isolated", "--launch",
                                  "tune --nnodes 1 --nproc_per_node 8 lora_finetune_distributed --config llama2/7B_lora",
                                  "recipes/lora_finetune_distributed.py"])
    assert r.exit_code == 0, r.output
    # Outside a torchtune checkout the recipe is the installed package's: a notice, not a usage error.
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "train.py").write_text("import torch\n")
    monkeypatch.chdir(other)
    r = CliRunner().invoke(main, ["check", "--isolated", "--launch",
                                  "tune --nproc_per_node 2 lora_finetune_distributed --config llama2/7B_lora", "train.py"])
    assert r.exit_code == 0 and "installed torchtune" in r.output, r.output
