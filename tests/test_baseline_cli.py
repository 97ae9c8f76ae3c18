"""Adopting fsdplint on a legacy codebase: --write-baseline / --baseline and --add-noqa."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

LEGACY = textwrap.dedent('''\
    from peft import get_peft_model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
    model = get_peft_model(model, lora_config)
''')


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(LEGACY)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*args):
    # Only FSDP101 and unused-noqa: the results must not change when other rules are added.
    return CliRunner().invoke(main, ["check", "--isolated", "--select", "FSDP101,FSDP902", *args], catch_exceptions=False)


def test_baseline_silences_old_findings_but_not_new_ones(repo):
    res = run("--write-baseline", "baseline.json", ".")
    assert res.exit_code == 0, res.output
    assert "Recorded 1 finding in baseline.json" in res.stderr
    assert run("--baseline", "baseline.json", ".").exit_code == 0

    # Unrelated edits above the finding: still silenced.
    (repo / "train.py").write_text("import os\n\n# set up\n" + LEGACY)
    res = run("--baseline", "baseline.json", ".")
    assert res.exit_code == 0 and "All checks passed!" in res.stdout

    # A new occurrence in another file is reported.
    (repo / "eval.py").write_text(LEGACY)
    res = run("--baseline", "baseline.json", "--output-format", "json", ".")
    assert res.exit_code == 1
    assert [Path(d["filename"]).name for d in json.loads(res.stdout)] == ["eval.py"]


def test_missing_baseline_is_a_usage_error(repo):
    res = run("--baseline", "nope.json", ".")
    assert res.exit_code == 2
    assert "nope.json: baseline file not found" in res.stderr and "Traceback" not in res.stderr


def test_add_noqa_then_clean_then_unused_noqa_reported(repo):
    res = run("--add-noqa", "train.py")
    assert res.exit_code == 0, res.output
    assert "Added 1 noqa directive." in res.stderr
    text = (repo / "train.py").read_text()
    assert "model = get_peft_model(model, lora_config)  # noqa: FSDP101\n" in text
    assert run("train.py").exit_code == 0
    # The bug is fixed by hand: the comment is now stale and says so.
    (repo / "train.py").write_text(text.replace("model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)\n", ""))
    res = run("--output-format", "json", "train.py")
    assert [d["code"] for d in json.loads(res.stdout)] == ["FSDP902"]


def test_add_noqa_refuses_fix(repo):
    res = run("--add-noqa", "--fix", "train.py")
    assert res.exit_code == 2 and "--add-noqa cannot be combined" in res.stderr
