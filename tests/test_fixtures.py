"""Realistic training scripts and fix pairs, run through the real CLI.

`fixtures/scripts/<name>.py` is linted with every rule; `<name>.expected.json` lists the findings
expected from it, either as a list of {"code", "line"} or as {"args": [...], "findings": [...]} when
the script needs its own CLI arguments (paths in args are relative to fixtures/scripts). Correct
scripts expect [], so a false positive of any rule shows up here. Expected codes of rules that have
no static check yet are ignored until the rule lands. Every static rule fires in some `<name>_buggy.py`
that has a close-but-correct `<name>_correct.py` twin.

`fixtures/fixes/<CODE>_<name>.in.py` is fixed with `--fix` (`--unsafe-fixes` when the name ends in
`.unsafe.in.py`) and compared with the matching `.out.py`; fixing the result again must change nothing.
An optional `<CODE>_<name>.args.json` (a JSON list of CLI arguments) adapts a pair to a rule that applies
only on other versions: its `--target-version PKG=VER` replace the pinned target of PKG, other arguments
are passed as they are (YAML/TOML paths relative to fixtures/fixes).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main
from fsdplint.findings import Applicability
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
# Diagnostics about the file itself (syntax error, internal error, unused noqa, unreadable file).
# Findings about the run itself (syntax, internal errors, noqa, unreadable files, analysis cut-offs), not rules.
META = {"FSDP900", "FSDP901", "FSDP902", "FSDP903", "FSDP905"}


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


def _pair_base(src: Path) -> str:
    """`FSDP104_qlora.unsafe.in.py` -> `FSDP104_qlora`."""
    base = src.name[: -len(".in.py")]
    return base[: -len(".unsafe")] if base.endswith(".unsafe") else base


def _pairs():
    for src in sorted(FIXES.glob("*.in.py")):
        out = src.with_name(src.name[: -len(".in.py")] + ".out.py")
        yield pytest.param(src, out, id=src.name[: -len(".in.py")])


def _pair_targets(src: Path) -> list[str]:
    """The pinned targets, with the pair's own arguments (if any) replacing those of the same package."""
    path = FIXES / (_pair_base(src) + ".args.json")
    if not path.is_file():
        return list(TARGETS)
    extra = json.loads(path.read_text())
    assert isinstance(extra, list) and all(isinstance(a, str) for a in extra), f"{path.name}: expected a list of strings"
    extra = [str(FIXES / a) if a.endswith((".yaml", ".yml", ".toml")) else a for a in extra]
    own = {extra[i + 1].split("=", 1)[0] for i, a in enumerate(extra[:-1]) if a == "--target-version"}
    pinned = [x for i in range(0, len(TARGETS), 2) for x in TARGETS[i : i + 2] if TARGETS[i + 1].split("=", 1)[0] not in own]
    return pinned + extra


@pytest.mark.parametrize("src,out", list(_pairs()))
def test_fix_pair(src, out, tmp_path):
    code = src.name.split("_", 1)[0]
    assert out.is_file(), f"{src.name} has no {out.name}"
    if code not in STATIC:
        pytest.skip(f"{code} has no static check yet")
    unsafe = src.name.endswith(".unsafe.in.py")
    flags = ["--fix", "--unsafe-fixes"] if unsafe else ["--fix"]
    targets = _pair_targets(src)
    work = tmp_path / "script.py"
    shutil.copy(src, work)
    if unsafe:
        # An unsafe fix is only offered: plain --fix must leave the file alone.
        result = _cli(["--fix", "--exit-zero", "--select", code, *targets, str(work)])
        assert result.exit_code == 0, result.output
        assert work.read_text() == src.read_text(), "--fix without --unsafe-fixes applied an unsafe fix"
    result = _cli([*flags, "--exit-zero", "--select", code, *targets, str(work)])
    assert result.exit_code == 0, result.output
    fixed = work.read_text()
    assert fixed != src.read_text(), f"{code} applied no fix to {src.name}"
    assert fixed == out.read_text()
    compile(fixed, out.name, "exec")
    again = _cli([*flags, "--exit-zero", "--select", code, *targets, str(work)])
    assert again.exit_code == 0 and work.read_text() == out.read_text(), "a second fix must change nothing"
    # The fixed file no longer has the finding the fix addresses.
    left = _cli(["--output-format", "json", "--exit-zero", "--select", code, *targets, str(work)])
    assert [f for f in json.loads(left.stdout) if f.get("fix")] == []


def test_pair_args_files_belong_to_a_pair():
    bases = {_pair_base(src) for src in FIXES.glob("*.in.py")}
    for path in FIXES.glob("*.args.json"):
        assert path.name[: -len(".args.json")] in bases, f"{path.name} has no matching .in.py"


def test_every_fixable_rule_has_a_fix_pair():
    pairs: dict[str, list[str]] = {}
    for src in FIXES.glob("*.in.py"):
        pairs.setdefault(src.name.split("_", 1)[0], []).append(src.name)
    for rule in all_rules():
        if rule.fix is None or not rule.has_static_check():
            continue
        names = pairs.get(rule.code)
        assert names, f"{rule.code} offers a fix but fixtures/fixes has no {rule.code}_<name>.in.py"
        # Unsafe fixes only apply with --unsafe-fixes; safe ones must apply with plain --fix.
        want_unsafe = rule.fix == Applicability.UNSAFE
        for name in names:
            assert name.endswith(".unsafe.in.py") == want_unsafe, (
                f"{name}: {rule.code}'s fix is {rule.fix.value}, name it "
                + ("<CODE>_<name>.unsafe.in.py" if want_unsafe else "<CODE>_<name>.in.py")
            )


def test_every_static_rule_fires_in_a_fixture_script():
    fired: set[str] = set()
    for script in _scripts():
        fired.update(code for code, _ in _expected(script)[1])
    missing = sorted(code for code in STATIC - META if code not in fired)
    assert not missing, f"no fixture script under fixtures/scripts expects {', '.join(missing)}"


def test_every_static_rule_has_a_close_but_correct_twin():
    """Each rule fires in some `<name>_buggy.py` whose `<name>_correct.py` twin expects no finding."""
    twinned: set[str] = set()
    for buggy in SCRIPTS.glob("*_buggy.py"):
        twin = buggy.with_name(buggy.name[: -len("_buggy.py")] + "_correct.py")
        if twin.is_file():
            assert _expected(twin)[1] == [], f"{twin.name} is the correct twin of {buggy.name} but expects findings"
            twinned.update(code for code, _ in _expected(buggy)[1])
    missing = sorted(code for code in STATIC - META if code not in twinned)
    assert not missing, f"no <name>_buggy.py with a <name>_correct.py twin expects {', '.join(missing)}"

