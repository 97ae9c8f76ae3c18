"""Report formats and terminal behaviour through the `fsdplint` command."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

BUGGY = textwrap.dedent('''\
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
''')


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(BUGGY)
    (tmp_path / "ok.py").write_text("import torch\nx = torch.ones(2)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NO_COLOR", raising=False)
    return tmp_path


def run(*args):
    # Only FSDP101: the output must not change when other rules are added.
    return CliRunner().invoke(main, ["check", "--isolated", "--select", "FSDP101", *args], catch_exceptions=False)


def test_concise_default_with_summary(project):
    res = run("train.py", "ok.py")
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert lines[0].startswith("train.py:6:9: FSDP101 ")
    assert "[error]" in lines[0]
    assert lines[-1].startswith("1 error in 1 file")
    assert "\x1b[" not in res.stdout


def test_clean_files_pass(project):
    res = run("ok.py")
    assert res.exit_code == 0 and res.stdout == "All checks passed!\n"


def test_full_shows_source_and_caret(project):
    res = run("--output-format", "full", "train.py")
    lines = res.stdout.splitlines()
    src = next(i for i, ln in enumerate(lines) if ln.startswith("6 |"))
    assert lines[src] == '6 | model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))'
    # The caret starts under the call the finding points at.
    assert lines[src][lines[src + 1].index("^"):].startswith("get_peft_model(")


def test_output_file_gets_the_report_and_stdout_stays_empty(project):
    res = run("--output-format", "json", "-o", "report.json", "train.py")
    assert res.exit_code == 1
    assert res.stdout == ""
    data = json.loads((project / "report.json").read_text())
    assert [d["code"] for d in data] == ["FSDP101"]
    assert data[0]["location"] == {"row": 6, "column": 9}


def test_output_file_in_missing_directory_is_a_clear_error(project):
    res = run("-o", "nope/report.txt", "train.py")
    assert res.exit_code == 2
    assert "nope/report.txt" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("fmt", ["github", "json-lines", "junit", "sarif"])
def test_machine_formats_parse(project, fmt):
    res = run("--output-format", fmt, "train.py", "ok.py")
    assert res.exit_code == 1
    if fmt == "github":
        assert res.stdout.startswith("::error file=train.py,line=6,col=9,")
    elif fmt == "json-lines":
        assert json.loads(res.stdout.splitlines()[0])["code"] == "FSDP101"
    elif fmt == "junit":
        assert ET.fromstring(res.stdout).find(".//failure").get("type") == "FSDP101"
    else:
        assert json.loads(res.stdout)["runs"][0]["results"][0]["ruleId"] == "FSDP101"


def test_statistics_and_show_fixes(project):
    res = run("--statistics", "--show-fixes", "train.py")
    lines = res.stdout.splitlines()
    assert lines[0].split("\t")[:2] == ["1", "FSDP101"]
    assert any("FSDP101 (unsafe fix)" in ln for ln in lines)


def test_color_flag_forces_colour(project):
    assert "\x1b[" in run("--color", "train.py").stdout
    assert "\x1b[" not in run("--no-color", "train.py").stdout


def _tty_run(args, env):
    """Run the CLI with stdout on a pseudo-terminal; returns what it printed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "fsdplint", *args], stdout=follower, stderr=follower, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks).decode()


def test_colour_on_a_tty_unless_no_color(project):
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    assert "\x1b[" in _tty_run(["--isolated", "train.py"], env)
    assert "\x1b[" not in _tty_run(["--isolated", "train.py"], {**env, "NO_COLOR": "1"})
