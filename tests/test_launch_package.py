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
