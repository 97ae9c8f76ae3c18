"""One rule crashing on one file is reported as FSDP901 naming the rule; everything else still runs."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from robust_support import BUGGY, extra_rule

from fsdplint.cli import main


EXPLODING = """
class ExplodingRule(Rule):
    code = "FSDP998"
    name = "exploding-rule"
    severity = Severity.ERROR
    needs_fsdp = False  # about the engine, not about FSDP: runs on any file
    summary = "Raises on files that contain the word EXPLODE."

    def check(self, ctx):
        if "EXPLODE" in ctx.source:
            raise ValueError("boom on purpose")
        if "RECURSE" in ctx.source:
            def down(n):
                return down(n + 1)
            down(0)
"""


@pytest.fixture
def exploding(tmp_path):
    with extra_rule(tmp_path, "fsdp998_exploding_rule", EXPLODING):
        yield


def codes_without_the_broken_rule(*args, input=None):
    """What the real rules report, before the throwaway rule is registered."""
    r = run(*args, "--output-format", "json", input=input)
    return sorted(f["code"] for f in json.loads(r.stdout))


@pytest.fixture
def project(tmp_path):
    d = tmp_path / "project"
    d.mkdir()
    (d / "a_explodes.py").write_text(BUGGY + "# EXPLODE\n")
    (d / "b_fine.py").write_text(BUGGY)
    return d


def run(*args, input=None):
    r = CliRunner().invoke(main, ["--isolated", *args], input=input)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def by_file(output):
    out = {}
    for f in json.loads(output):
        out.setdefault(os.path.basename(f["filename"]), []).append(f)
    return out


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_crash_is_a_finding_naming_the_rule_and_other_rules_still_report(tmp_path, project, jobs):
    expected = codes_without_the_broken_rule(str(project / "b_fine.py"))
    assert "FSDP101" in expected
    with extra_rule(tmp_path, "fsdp998_exploding_rule", EXPLODING):
        r = run(str(project), "--output-format", "json", "-j", jobs)
    assert r.exit_code == 1, r.output
    got = by_file(r.stdout)
    a = {f["code"]: f for f in got["a_explodes.py"]}
    assert sorted(a) == sorted(expected + ["FSDP901"])
    msg = a["FSDP901"]["message"]
    assert "FSDP998" in msg and "exploding-rule" in msg and "ValueError: boom on purpose" in msg
    assert "Traceback" not in msg and "\n" not in msg
    assert sorted(f["code"] for f in got["b_fine.py"]) == expected


@pytest.mark.parametrize("flag", ["-v", "--show-internal-errors"])
def test_traceback_only_when_asked(exploding, project, flag):
    quiet = run(str(project / "a_explodes.py"))
    assert quiet.exit_code == 1 and "FSDP901" in quiet.output and "Traceback" not in quiet.output
    loud = run(str(project / "a_explodes.py"), flag)
    assert loud.exit_code == 1
    assert "Traceback (most recent call last)" in loud.output
    assert "fsdp998_exploding_rule.py" in loud.output and 'raise ValueError("boom on purpose")' in loud.output
    assert "FSDP101" in loud.output
    assert loud.output.count("Traceback") == 1


def test_runaway_recursion_in_a_rule_is_contained(tmp_path):
    p = tmp_path / "r.py"
    p.write_text(BUGGY + "# RECURSE\n")
    expected = codes_without_the_broken_rule(str(p))
    with extra_rule(tmp_path, "fsdp998_exploding_rule", EXPLODING):
        r = run(str(p), "--output-format", "json")
    assert r.exit_code == 1
    codes = sorted(f["code"] for f in json.loads(r.stdout))
    assert codes == sorted(expected + ["FSDP901"])
    (err,) = [f for f in json.loads(r.stdout) if f["code"] == "FSDP901"]
    assert "FSDP998" in err["message"]


def test_crash_on_stdin_and_ignoring_the_broken_rule(tmp_path):
    expected = codes_without_the_broken_rule("-", input=BUGGY + "# EXPLODE\n")
    with extra_rule(tmp_path, "fsdp998_exploding_rule", EXPLODING):
        r = run("-", "--stdin-filename", "train.py", "--output-format", "json", input=BUGGY + "# EXPLODE\n")
        assert r.exit_code == 1
        assert sorted(f["code"] for f in json.loads(r.stdout)) == sorted(expected + ["FSDP901"])
        assert {f["filename"] for f in json.loads(r.stdout)} == {"train.py"}
        # The workaround the rule's doc gives: ignore the failing rule.
        r = run("-", "--output-format", "json", "--ignore", "FSDP998", input=BUGGY + "# EXPLODE\n")
        assert sorted(f["code"] for f in json.loads(r.stdout)) == expected


def test_a_crashing_rule_does_not_block_fixes_of_the_others(exploding, tmp_path):
    p = tmp_path / "fixme.py"
    p.write_text(BUGGY + "# EXPLODE\n")
    r = run(str(p), "--fix", "--unsafe-fixes", "--output-format", "json")
    assert r.exit_code == 1
    codes = [f["code"] for f in json.loads(r.stdout)]
    assert "FSDP901" in codes and "FSDP101" not in codes
    assert p.read_text().index("get_peft_model(model") < p.read_text().index("FSDP(model")


AUDIT_EXPLODING = """
class ExplodingAudit(Rule):
    code = "FSDP997"
    name = "exploding-audit"
    severity = Severity.ERROR
    summary = "Raises while auditing any model."
    sides = "A"

    def audit(self, ctx):
        raise KeyError("audit boom")
"""


def test_audit_rule_crash_is_contained(tmp_path, fixtures_dir):
    from fsdplint.audit.cli import model_command

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "model": str(fixtures_dir / "models" / "gpt2.json"),
        "lora": {"r": 8, "target_modules": ["c_attn", "c_atn"]},
        "fsdp": {"version": 2, "world_size": 2},
    }))
    with extra_rule(tmp_path, "fsdp997_exploding_audit", AUDIT_EXPLODING):
        r = CliRunner().invoke(model_command, [str(spec), "--output-format", "json"])
    assert r.exit_code == 1, r.output
    found = {f["code"]: f["message"] for f in json.loads(r.stdout)["findings"]}
    assert "FSDP113" in found  # the typo'd target is still reported
    assert "FSDP997" in found["FSDP901"] and "KeyError" in found["FSDP901"]
