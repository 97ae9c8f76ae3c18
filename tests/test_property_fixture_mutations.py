"""Mutated fixture scripts never crash the linter; meaning-preserving mutations keep the findings.

CI runs a fixed, derandomized number of examples per property; set FSDPLINT_FUZZ_EXAMPLES
(e.g. 2000) for a long run.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import random
from collections import Counter
from pathlib import Path

import mutations
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdplint.cli import main

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "fixtures" / "scripts"
NAMES = sorted(p.name for p in SCRIPTS.glob("*.py"))
# Pinned so the findings do not depend on what happens to be installed (as tests/test_fixtures.py).
TARGETS = [
    "--target-version", "torch=2.6", "--target-version", "accelerate=1.15.0", "--target-version", "peft=0.21.2",
    "--target-version", "transformers=5.24.0", "--target-version", "bitsandbytes=0.50.2",
]
EXAMPLES = int(os.environ.get("FSDPLINT_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _args(name: str) -> list[str]:
    data = json.loads((SCRIPTS / name).with_suffix(".expected.json").read_text())
    args = data.get("args", []) if isinstance(data, dict) else []
    return [str(SCRIPTS / a) if a.endswith((".yaml", ".yml", ".toml")) else a for a in args]


def lint(text: str, name: str) -> list[tuple[str, str, int, str]]:
    """(file, code, row, stripped line text) of every finding; fails on a crash."""
    r = CliRunner().invoke(main, ["check", "--isolated", "--output-format", "json", "--exit-zero", *TARGETS,
                                  *_args(name), "--stdin-filename", name, "-"], input=text)
    assert r.exit_code == 0 and r.exception is None or isinstance(r.exception, SystemExit), r.output
    assert "Traceback" not in r.output, r.output
    found = json.loads(r.stdout)
    lines = text.splitlines()
    out = []
    for f in found:
        assert f["code"] not in ("FSDP900", "FSDP901"), f["message"]
        row = f["location"]["row"]
        here = f["filename"] == name
        out.append((Path(f["filename"]).name, f["code"], row,
                    lines[row - 1].strip() if here and 0 < row <= len(lines) else ""))
    return sorted(out)


def fix(text: str, name: str) -> str:
    r = CliRunner().invoke(main, ["check", "--isolated", "--fix", "--unsafe-fixes", "--exit-zero", *TARGETS,
                                  *_args(name), "--stdin-filename", name, "-"], input=text)
    assert r.exit_code == 0, r.output
    return r.stdout


@functools.lru_cache(maxsize=None)
def original(name: str) -> tuple[str, tuple]:
    text = (SCRIPTS / name).read_text()
    return text, tuple(lint(text, name))


def check_fix(text: str, name: str) -> None:
    """The fix output parses and fixing it again changes nothing."""
    once = fix(text, name)
    ast.parse(once)
    assert fix(once, name) == once


scripts = st.sampled_from(NAMES)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


# Objects rules once recognised by their conventional name; they are now known by what was
# assigned to them, and renaming them must keep every finding.
NAME_SENSITIVE = {
    ("accelerate_fsdp1_low_ram_buggy.py", "accelerator"): ["FSDP007", "FSDP009"],
    ("accelerate_fsdp2_lora_buggy.py", "accelerator"): ["FSDP401", "FSDP402"],
    ("accelerate_fsdp2_moe_lora_buggy.py", "accelerator"): ["FSDP108"],
    ("fsdp1_rank0_loading_buggy.py", "rank"): ["FSDP011"],
    ("fsdp2_lora_after_shard_buggy.py", "rank"): ["FSDP401"],
    ("trainer_fsdp_qlora_buggy.py", "trainer"): ["FSDP401"],
}


@FUZZ
@given(scripts, seeds)
def test_renamed_variables_keep_findings_and_lines(name, seed):
    text, before = original(name)
    mutated = mutations.rename_variables(text, random.Random(seed))
    got = lint(mutated, name)
    assert [(f, c, r) for f, c, r, _ in got] == [(f, c, r) for f, c, r, _ in before]


@pytest.mark.parametrize("name,var", sorted(NAME_SENSITIVE))
def test_known_name_sensitivity(name, var):
    text, before = original(name)
    got = lint(mutations.rename(text, {var: "renamed_"}), name)
    assert [c for _, c, _, _ in got] == [c for _, c, _, _ in before]


@FUZZ
@given(scripts, seeds)
def test_aliased_imports_keep_findings_and_lines(name, seed):
    text, before = original(name)
    mutated = mutations.alias_imports(text, random.Random(seed))
    got = lint(mutated, name)
    # `from torch.distributed.fsdp import fully_shard` -> `import torch.distributed.fsdp as m`: that import
    # works on every torch, and the missing name fails where `m.fully_shard` is used, so an FSDP008 (import
    # path) finding moves from the import to the uses. Every other finding keeps its line.
    moves = {"FSDP008"}
    assert [(f, c, r) for f, c, r, _ in got if c not in moves] == [(f, c, r) for f, c, r, _ in before if c not in moves]
    assert {(f, c) for f, c, _, _ in got if c in moves} == {(f, c) for f, c, _, _ in before if c in moves}


@FUZZ
@given(scripts, seeds)
def test_reordered_independent_statements_keep_findings(name, seed):
    text, before = original(name)
    mutated = mutations.reorder_independent(text, random.Random(seed))
    got = lint(mutated, name)
    # Lines move with their statements: compare each finding's line text.
    assert Counter((f, c, t) for f, c, _, t in got) == Counter((f, c, t) for f, c, _, t in before)


@FUZZ
@given(scripts)
def test_main_guard_keeps_findings(name):
    text, before = original(name)
    mutated = mutations.wrap_in_main_guard(text, random.Random(0))
    got = lint(mutated, name)
    assert Counter((f, c, t) for f, c, _, t in got) == Counter((f, c, t) for f, c, _, t in before)


@FUZZ
@given(scripts, st.lists(st.sampled_from(["rename", "alias", "reorder", "guard", "function", "odd"]),
                         min_size=1, max_size=4), seeds)
def test_mutation_chains_never_crash_and_fixes_reparse(name, ops, seed):
    rng = random.Random(seed)
    text = original(name)[0]
    table = {"rename": mutations.rename_variables, "alias": mutations.alias_imports,
             "reorder": mutations.reorder_independent, "guard": mutations.wrap_in_main_guard,
             "function": mutations.wrap_in_function, "odd": mutations.replace_keyword_values}
    for op in ops:
        text = table[op](text, rng)
    lint(text, name)
    check_fix(text, name)


@pytest.mark.parametrize("name", NAMES)
def test_fix_output_reparses_and_is_idempotent_on_every_fixture(name):
    check_fix(original(name)[0], name)


# -- refactorings of real projects: the project view keeps the findings ------------------------------------
BUGGY = [n for n in NAMES if n.endswith("_buggy.py")]


def lint_package(files: dict, name: str, tmp: Path) -> list[tuple[str, int]]:
    """(code, row) of the findings on pkg/train.py, linted as a module of a package with its siblings."""
    (tmp / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    pkg = tmp / "pkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    for fname, text in files.items():
        (pkg / fname).write_text(text)
    r = CliRunner().invoke(main, ["check", "--isolated", "--output-format", "json", "--exit-zero", "--no-cache",
                                  *TARGETS, *(a.replace(name, "train.py") for a in _args(name)),
                                  str(pkg / "train.py")])  # a `--launch` names the script by its new name
    assert r.exit_code == 0, r.output
    found = json.loads(r.stdout)
    assert all(f["code"] not in ("FSDP900", "FSDP901") for f in found), found
    # The helper's module is read, not reported (a launch config's own lines may be).
    assert {f["filename"] for f in found if not f["filename"].endswith((".yaml", ".yml"))} <= {str(pkg / "train.py")}
    return [(f["code"], f["location"]["row"]) for f in found]


def _codes(found) -> Counter:
    return Counter(c for _, c, _, _ in found)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", BUGGY)
def test_extracted_helper_keeps_findings(name, seed):
    text, before = original(name)
    assert _codes(lint(mutations.extract_helper(text, random.Random(seed)), name)) == _codes(before)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", BUGGY)
def test_helper_in_another_module_keeps_findings(name, seed, tmp_path):
    text, before = original(name)
    files = mutations.move_helper_to_module(text, random.Random(seed))
    got = lint_package(files, name, tmp_path)
    assert Counter(c for c, _ in got) == _codes(before)


@pytest.mark.parametrize("name", BUGGY)
def test_helper_returning_the_call_keeps_findings(name, tmp_path):
    """`return get_peft_model(model, cfg)` (not a name) in a helper of the same file or another module."""
    text, before = original(name)
    assert _codes(lint(mutations.extract_helper(text, random.Random(0), expression=True), name)) == _codes(before)
    files = mutations.move_helper_to_module(text, random.Random(1), expression=True)
    assert Counter(c for c, _ in lint_package(files, name, tmp_path)) == _codes(before)


@pytest.mark.parametrize("name", BUGGY)
def test_second_name_keeps_findings(name):
    text, before = original(name)
    assert _codes(lint(mutations.second_name(text, random.Random(0)), name)) == _codes(before)


@pytest.mark.parametrize("name", BUGGY)
def test_trainer_class_keeps_findings(name):
    text, before = original(name)
    assert _codes(lint(mutations.into_class(text, random.Random(0)), name)) == _codes(before)


@FUZZ
@given(st.sampled_from(BUGGY), seeds)
def test_flags_through_argparse_with_defaults_keep_findings(name, seed):
    """Literal keyword values passed through argparse flags whose defaults are those literals:
    with no launcher the defaults hold, so every finding stays, on the same line."""
    text, before = original(name)
    mutated = mutations.argparse_flags(text, random.Random(seed))
    got = lint(mutated, name)
    assert Counter((f, c, r) for f, c, r, _ in got) == Counter((f, c, r) for f, c, r, _ in before), mutated
