"""Every AUDIT_VALID / AUDIT_INVALID example of every rule, run on the meta device.

Invalid examples must report the rule's code, valid ones must not. All examples run in
this one process, so torch/transformers/peft import once.
"""

from __future__ import annotations

import pytest

from fsdplint.registry import all_rules


def _cases():
    for rule in all_rules():
        for kind, examples in (("valid", rule.AUDIT_VALID), ("invalid", rule.AUDIT_INVALID)):
            for i, example in enumerate(examples):
                yield pytest.param(rule, kind, example, id=f"{rule.code}-{kind}-{i}")


@pytest.mark.parametrize("rule,kind,example", list(_cases()))
def test_audit_example(rule, kind, example):
    from fsdplint.audit import run_audit, spec_from_dict

    result = run_audit(spec_from_dict(example, filename="example.json"))
    codes = {f.code for f in result.findings}
    if kind == "invalid":
        assert rule.code in codes, f"{rule.code} not reported; got {sorted(codes)}"
        assert result.exit_code == 1
    else:
        mine = [f.message for f in result.findings if f.code == rule.code]
        assert not mine, mine


def test_every_audit_rule_has_examples_both_ways():
    for rule in all_rules():
        if rule.has_audit():
            assert rule.AUDIT_VALID and rule.AUDIT_INVALID, rule.code
            assert "A" in rule.sides, rule.code
