"""Configuration through the `fsdplint` command: discovery, precedence, warnings, errors."""

from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from fsdplint import config as cfgmod
from fsdplint.cli import main

BUGGY = textwrap.dedent('''\
    from peft import get_peft_model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
    model = get_peft_model(model, lora_config)
''')


@pytest.fixture
def tree(tmp_path, monkeypatch):
    cfgmod.clear_cache()
    for rel in ("train.py", "sub/train.py", "legacy/train.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(BUGGY)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    cfgmod.clear_cache()


def codes_by_file(*args):
    res = CliRunner().invoke(main, ["check", "--output-format", "json", *args], catch_exceptions=False)
    assert res.exit_code in (0, 1), res.output
    out = {}
    for d in json.loads(res.stdout):
        if d["code"] != "FSDP101":
            continue  # the configuration mechanics are checked on one rule
        out.setdefault(d["filename"].replace("\\", "/"), set()).add(d["code"])
    return out, res


def test_pyproject_ignore_and_per_file_ignores_apply(tree):
    (tree / "pyproject.toml").write_text(
        '[tool.fsdplint]\nextend-exclude = ["legacy"]\n[tool.fsdplint.per-file-ignores]\n"sub/*" = ["FSDP101"]\n'
    )
    found, _ = codes_by_file(".")
    assert found == {"train.py": {"FSDP101"}}


def test_nested_config_wins_for_its_directory(tree):
    (tree / "pyproject.toml").write_text('[tool.fsdplint]\nignore = ["FSDP101"]\n')
    (tree / "sub" / "fsdplint.toml").write_text('select = ["FSDP1"]\n')
    found, _ = codes_by_file("train.py", "sub/train.py")
    assert found == {"sub/train.py": {"FSDP101"}}


def test_cli_select_wins_over_config_ignore(tree):
    (tree / "pyproject.toml").write_text('[tool.fsdplint]\nignore = ["FSDP101"]\n')
    assert codes_by_file("train.py")[0] == {}
    assert codes_by_file("--select", "FSDP101", "train.py")[0] == {"train.py": {"FSDP101"}}


def test_explicit_config_and_isolated(tree):
    (tree / "pyproject.toml").write_text('[tool.fsdplint]\nignore = ["FSDP101"]\n')
    (tree / "strict.toml").write_text('select = ["ALL"]\n')
    assert codes_by_file("--config", "strict.toml", "train.py")[0] == {"train.py": {"FSDP101"}}
    assert codes_by_file("--isolated", "train.py")[0] == {"train.py": {"FSDP101"}}


def test_unknown_key_is_a_warning_and_the_run_goes_on(tree):
    (tree / "pyproject.toml").write_text('[tool.fsdplint]\nslect = ["FSDP1"]\n')
    found, res = codes_by_file("train.py")
    assert found == {"train.py": {"FSDP101"}}
    assert "warning" in res.stderr and "`slect`" in res.stderr and "pyproject.toml" in res.stderr


def test_toml_error_exits_2_with_file_and_line(tree):
    (tree / "pyproject.toml").write_text('[tool.fsdplint]\nselect = [\n')
    res = CliRunner().invoke(main, ["check", "."], catch_exceptions=False)
    assert res.exit_code == 2
    assert "pyproject.toml:" in res.stderr and "invalid TOML" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_force_exclude_applies_to_named_files(tree):
    (tree / "pyproject.toml").write_text('[tool.fsdplint]\nextend-exclude = ["legacy"]\n')
    assert codes_by_file("legacy/train.py")[0] == {"legacy/train.py": {"FSDP101"}}
    assert codes_by_file("--force-exclude", "legacy/train.py")[0] == {}


def test_yaml_files_named_by_pre_commit_are_not_linted_as_python(tree):
    (tree / "config.yaml").write_text("compute_environment: LOCAL_MACHINE\n")
    found, res = codes_by_file("config.yaml", "train.py")
    assert found == {"train.py": {"FSDP101"}}
