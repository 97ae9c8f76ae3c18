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
