"""The `fsdplint` command as a user runs it: click's runner and the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

BUGGY = textwrap.dedent(
    """\
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def main(model, policy):
        model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
        return model
    """
)
CLEAN = textwrap.dedent(
    """\
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def main(model, policy):
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
        model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
        return model
    """
)


def run(*args, input=None):
    return CliRunner().invoke(main, ["--isolated", *args] if args and args[0] not in ("rule", "rules") else list(args), input=input)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "buggy.py").write_text(BUGGY)
    (tmp_path / "clean.py").write_text(CLEAN)
    return tmp_path


def test_exit_codes(project):
    assert run(str(project / "clean.py")).exit_code == 0
    r = run(str(project / "buggy.py"))
    assert r.exit_code == 1
    assert "FSDP101" in r.output and "buggy.py:7:" in r.output
    assert run(str(project / "buggy.py"), "--exit-zero").exit_code == 0
    assert run(str(project / "buggy.py"), "--select", "NOPE").exit_code == 2
    r = run(str(project / "missing.py"))
    assert r.exit_code == 2 and "missing.py" in r.output and "Traceback" not in r.output


def test_directory_and_select_ignore(project):
    r = run(str(project), "--output-format", "json")
    codes = [d["code"] for d in json.loads(r.output)]
    assert codes == ["FSDP101"]
    assert json.loads(run(str(project), "--output-format", "json", "--ignore", "FSDP1").output) == []
    assert json.loads(run(str(project), "--output-format", "json", "--select", "FSDP2").output) == []
    assert len(json.loads(run(str(project), "--output-format", "json", "--select", "FSDP101").output)) == 1


def test_json_schema_is_ruff_compatible(project):
    r = run(str(project / "buggy.py"), "--output-format", "json")
    (d,) = json.loads(r.output)
    assert set(d) == {"code", "name", "severity", "filename", "location", "end_location", "message", "url", "fix"}
    assert d["location"] == {"row": 7, "column": 13}
    assert d["end_location"]["row"] == 7 and d["end_location"]["column"] > 13
    assert d["name"] == "lora-after-fsdp-wrap" and d["severity"] == "error"
    assert d["fix"]["applicability"] == "unsafe"
    for e in d["fix"]["edits"]:
        assert set(e) == {"content", "location", "end_location"}


def test_full_format_shows_source_and_caret(project):
    r = run(str(project / "buggy.py"), "--output-format", "full")
    assert "get_peft_model(model, LoraConfig" in r.output
    assert "^" in r.output


def test_noqa(project):
    p = project / "buggy.py"
    p.write_text(BUGGY.replace('["q_proj", "v_proj"]))', '["q_proj", "v_proj"]))  # noqa: FSDP101'))
    assert run(str(p)).exit_code == 0
    p.write_text(BUGGY.replace('["q_proj", "v_proj"]))', '["q_proj", "v_proj"]))  # noqa'))
    assert run(str(p)).exit_code == 0
    p.write_text(BUGGY.replace('["q_proj", "v_proj"]))', '["q_proj", "v_proj"]))  # noqa: FSDP201'))
    assert run(str(p)).exit_code == 1
    p.write_text("# fsdplint: noqa\n" + BUGGY)
    assert run(str(p)).exit_code == 0


def test_unsafe_fix_only_with_flag_and_idempotent(project):
    p = project / "buggy.py"
    r = run(str(p), "--fix")
    assert r.exit_code == 1 and p.read_text() == BUGGY  # the fix is unsafe: not applied
    r = run(str(p), "--diff", "--unsafe-fixes")
    assert r.exit_code == 1 and "+    model = get_peft_model" in r.output and p.read_text() == BUGGY
    mode = p.stat().st_mode
    r = run(str(p), "--fix", "--unsafe-fixes")
    assert r.exit_code == 0, r.output
    fixed = p.read_text()
    assert fixed == CLEAN
    assert p.stat().st_mode == mode
    r = run(str(p), "--fix", "--unsafe-fixes")
    assert r.exit_code == 0 and p.read_text() == fixed


def test_fix_keeps_crlf_and_bom(project):
    p = project / "crlf.py"
    p.write_bytes(b"\xef\xbb\xbf" + BUGGY.replace("\n", "\r\n").encode())
    assert run(str(p), "--fix", "--unsafe-fixes").exit_code == 0
    data = p.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf")
    assert data[3:].decode() == CLEAN.replace("\n", "\r\n")


def test_stdin(project):
    r = run("-", "--stdin-filename", "train.py", input=BUGGY)
    assert r.exit_code == 1 and "train.py:7:" in r.output
    r = run("-", "--fix", "--unsafe-fixes", input=BUGGY)
    assert r.stdout.startswith(CLEAN) if hasattr(r, "stdout") else CLEAN in r.output


def test_syntax_error_is_a_finding_and_others_still_linted(project):
    (project / "broken.py").write_text("import peft\ndef f(:\n")
    r = run(str(project), "--output-format", "json")
    found = {(Path(d["filename"]).name, d["code"]) for d in json.loads(r.output)}
    assert ("broken.py", "FSDP900") in found and ("buggy.py", "FSDP101") in found
    assert r.exit_code == 1


def test_rule_and_rules_commands():
    r = run("rule", "FSDP101")
    assert r.exit_code == 0 and "## Why is this bad?" in r.output and "lora-after-fsdp-wrap" in r.output
    assert run("rule", "lora-after-fsdp-wrap").exit_code == 0
    assert run("rule", "FSDP999").exit_code == 2
    r = run("rules")
    assert r.exit_code == 0 and "FSDP101" in r.output and "lora-after-fsdp-wrap" in r.output
    rows = json.loads(run("rules", "--output-format", "json").output)
    assert {"code", "name", "severity", "sides", "fix"} <= set(rows[0])


def test_jobs_give_the_same_findings(project):
    for i in range(20):
        shutil.copy(project / "buggy.py", project / f"b{i}.py")
    one = json.loads(run(str(project), "-j", "1", "--output-format", "json").output)
    two = json.loads(run(str(project), "-j", "2", "--output-format", "json").output)
    assert one == two and len(one) == 21


def test_console_script_subprocess(project):
    exe = shutil.which("fsdplint", path=os.path.dirname(sys.executable)) or shutil.which("fsdplint")
    assert exe, "the fsdplint console script is installed"
    p = subprocess.run([exe, "--isolated", str(project / "buggy.py"), "--output-format", "json"], capture_output=True, text=True)
    assert p.returncode == 1
    assert json.loads(p.stdout)[0]["code"] == "FSDP101"
    p = subprocess.run([exe, "--isolated", str(project / "clean.py")], capture_output=True, text=True)
    assert p.returncode == 0


def test_console_script_delivers_a_large_report_whole(project):
    """The console script ends with a fast exit: a report far larger than a pipe's buffer,
    to stdout and to `-o`, still arrives whole, with the right exit code."""
    exe = shutil.which("fsdplint", path=os.path.dirname(sys.executable)) or shutil.which("fsdplint")
    for i in range(150):
        shutil.copy(project / "buggy.py", project / f"b{i:03}.py")
    p = subprocess.run([exe, "--isolated", "-j", "1", "--output-format", "json", str(project)], capture_output=True, text=True)
    assert p.returncode == 1 and len(p.stdout) > 2 * 65536  # a pipe holds 64 KiB
    assert len(json.loads(p.stdout)) == 151
    out = project.parent / "report.json"
    p = subprocess.run([exe, "--isolated", "-j", "1", "--output-format", "json", "-o", str(out), str(project)], capture_output=True, text=True)
    assert p.returncode == 1 and p.stdout == ""
    assert len(json.loads(out.read_text())) == 151


def test_console_script_into_a_closed_pipe(project):
    """`fsdplint DIR | head -1`: the reader leaves early; no traceback, no hang."""
    exe = shutil.which("fsdplint", path=os.path.dirname(sys.executable)) or shutil.which("fsdplint")
    for i in range(150):
        shutil.copy(project / "buggy.py", project / f"b{i:03}.py")
    proc = subprocess.Popen([exe, "--isolated", "-j", "1", "--output-format", "full", str(project)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) != 0
    assert b"FSDP101" in first
    assert "Traceback" not in err


def test_target_version_flags(tmp_path):
    bad = tmp_path / "t.py"
    bad.write_text("x = 1\n")
    r = run(str(bad), "--target-version", "torch")
    assert r.exit_code == 2 and "PACKAGE=VERSION" in r.output
    assert run(str(bad), "--target-version", "torch=2.6", "--torch-version", "2.7").exit_code == 0
