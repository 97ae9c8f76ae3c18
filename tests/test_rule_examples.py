"""Every VALID/INVALID example of every rule file becomes a test (as Fixit does)."""

from __future__ import annotations

import libcst as cst
import pytest

from fsdplint.registry import all_rules
from fsdplint.rule import DOC_SECTIONS
from rule_harness import fix_example, lint_example

META = {"FSDP900", "FSDP901", "FSDP903"}


def _cases(kind):
    for rule in all_rules():
        if not rule.has_static_check() and rule.code not in ("FSDP900", "FSDP902"):
            continue
        examples = rule.valid_examples() if kind == "valid" else list(rule.INVALID)
        for i, ex in enumerate(examples):
            yield pytest.param(rule, ex, id=f"{rule.code}-{kind}-{i}")


@pytest.mark.parametrize("rule,example", list(_cases("valid")))
def test_valid_example_is_silent(rule, example):
    found = [f for f in lint_example(rule, example) if f.code == rule.code]
    assert not found, f"{rule.code} fired on a VALID example:\n{example.source()}\n{[f.message for f in found]}"


@pytest.mark.parametrize("rule,example", list(_cases("invalid")))
def test_invalid_example_fires(rule, example):
    found = [f for f in lint_example(rule, example) if f.code == rule.code]
    assert found, f"{rule.code} did not fire on an INVALID example:\n{example.source()}"
    if example.line is not None:
        assert example.line in [f.start.row for f in found], (
            f"{rule.code} fired at lines {[f.start.row for f in found]}, expected {example.line}"
        )
    expected = example.severity or rule.severity.value
    for f in found:
        assert f.message and f.name == rule.name and f.severity.value == expected


@pytest.mark.parametrize(
    "rule,example", [p for p in _cases("invalid") if p.values[1].expected_fix is not None]
)
def test_invalid_example_fix(rule, example):
    fixed, applied = fix_example(rule, example)
    assert applied >= 1
    assert fixed == example.fixed_source()
    cst.parse_module(fixed)
    again, applied_again = fix_example(rule, type(example)(fixed, target=example.target, options=example.options))
    assert applied_again == 0 and again == fixed, "a second --fix must change nothing"


@pytest.mark.parametrize("rule", [r for r in all_rules() if r.code not in META], ids=lambda r: r.code)
def test_rule_metadata_complete(rule):
    import re

    assert re.fullmatch(r"FSDP\d{3}", rule.code)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.name)
    for section in DOC_SECTIONS:
        assert f"## {section}" in rule.doc, f"{rule.code} doc lacks '## {section}'"
    if "S" in rule.sides and rule.has_static_check():
        assert len(rule.valid_examples()) >= 3, f"{rule.code} needs >= 3 VALID examples"
        assert len(rule.INVALID) >= 3, f"{rule.code} needs >= 3 INVALID examples"
    if rule.fix is not None and rule.has_static_check():
        assert any(i.expected_fix for i in rule.INVALID), f"{rule.code} offers a fix but no example shows it"
