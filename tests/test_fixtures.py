"""Realistic training scripts and fix pairs, run through the real CLI.

`fixtures/scripts/<name>.py` is linted with every rule; `<name>.expected.json` lists the findings
expected from it, either as a list of {"code", "line"} or as {"args": [...], "findings": [...]} when
the script needs its own CLI arguments (paths in args are relative to fixtures/scripts). Correct
scripts expect [], so a false positive of any rule shows up here. Expected codes of rules that have
no static check yet are ignored until the rule lands.

`fixtures/fixes/<CODE>_<name>.in.py` is fixed with `--fix` (`--unsafe-fixes` when the name ends in
`.unsafe.in.py`) and compared with the matching `.out.py`; fixing the result again must change nothing.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main
from fsdplint.registry import all_rules

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "fixtures" / "scripts"
FIXES = ROOT / "fixtures" / "fixes"
# Pinned so the results do not depend on what happens to be installed.
TARGETS = [
    "--target-version", "torch=2.6", "--target-version", "accelerate=1.15.0", "--target-version", "peft=0.21.2",
    "--target-version", "transformers=5.24.0", "--target-version", "bitsandbytes=0.50.2",
]
STATIC = {r.code for r in all_rules() if r.has_static_check()}


def _scripts():
    return sorted(p for p in SCRIPTS.glob("*.py"))


def _expected(script: Path) -> tuple[list[str], list[tuple[str, int]]]:
    exp_path = script.with_name(script.stem + ".expected.json")
    assert exp_path.is_file(), f"{script.name} has no {exp_path.name}"
    data = json.loads(exp_path.read_text())
    args: list[str] = []
    if isinstance(data, dict):
        args = [str(SCRIPTS / a) if a.endswith((".yaml", ".yml", ".toml")) else a for a in data.get("args", [])]
        data = data["findings"]
    for item in data:
        assert re.fullmatch(r"FSDP\d{3}", item["code"]) and isinstance(item["line"], int), item
    return args, sorted((d["code"], d["line"]) for d in data)


def _cli(args: list[str], input: str | None = None):
    result = CliRunner().invoke(main, ["check", "--isolated", *args], input=input, catch_exceptions=False)
    return result


def _lint(script: Path, extra: list[str]) -> list[tuple[str, int]]:
    # Later --target-version values override the pinned ones.
    result = _cli(["--output-format", "json", "--exit-zero", *TARGETS, *extra, str(script)])
    assert result.exit_code == 0, result.output
    return sorted((f["code"], f["location"]["row"]) for f in json.loads(result.stdout))


@pytest.mark.parametrize("script", _scripts(), ids=lambda p: p.stem)
def test_fixture_script_findings(script):
    args, expected = _expected(script)
    expected = [(c, line) for c, line in expected if c in STATIC]
    found = _lint(script, args)
    assert found == expected, f"{script.name}: found {found}, expected {expected}"


def test_fixture_set_is_realistic():
    scripts = _scripts()
    assert len(scripts) >= 12
    for s in scripts:
        n = len(s.read_text().splitlines())
        assert 60 <= n <= 200, f"{s.name} has {n} lines"
    correct = [s for s in scripts if not _expected(s)[1]]
    assert len(correct) >= 4 and len(correct) < len(scripts)


def _pairs():
    for src in sorted(FIXES.glob("*.in.py")):
        out = src.with_name(src.name[: -len(".in.py")] + ".out.py")
        yield pytest.param(src, out, id=src.name[: -len(".in.py")])


@pytest.mark.parametrize("src,out", list(_pairs()))
def test_fix_pair(src, out, tmp_path):
    code = src.name.split("_", 1)[0]
    assert out.is_file(), f"{src.name} has no {out.name}"
    if code not in STATIC:
        pytest.skip(f"{code} has no static check yet")
    flags = ["--fix", "--unsafe-fixes"] if src.name.endswith(".unsafe.in.py") else ["--fix"]
    work = tmp_path / "script.py"
    shutil.copy(src, work)
    result = _cli([*flags, "--exit-zero", "--select", code, *TARGETS, str(work)])
    assert result.exit_code == 0, result.output
    assert work.read_text() == out.read_text()
    again = _cli([*flags, "--exit-zero", "--select", code, *TARGETS, str(work)])
    assert again.exit_code == 0 and work.read_text() == out.read_text(), "a second fix must change nothing"
    # The fixed file no longer has the finding the fix addresses.
    left = _cli(["--output-format", "json", "--exit-zero", "--select", code, *TARGETS, str(work)])
    assert [f for f in json.loads(left.stdout) if f.get("fix")] == []


def test_every_fixable_rule_has_a_fix_pair():
    have = {p.name.split("_", 1)[0] for p in FIXES.glob("*.in.py")}
    # Rules this fixture set covers so far; rules added later bring their own pair.
    for code in ("FSDP101", "FSDP202"):
        assert code in have
