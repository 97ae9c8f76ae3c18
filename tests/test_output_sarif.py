"""SARIF 2.1.0 output, validated against the official schema."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from fsdplint.findings import Applicability, Edit, Finding, Fix, Position, Severity
from fsdplint.output import write_report
from fsdplint.registry import all_rules

SCHEMA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sarif-schema-2.1.0.json"


def finding(**kw):
    base = dict(code="FSDP101", name="lora-after-fsdp-wrap", severity=Severity.ERROR, filename="src/train.py",
                start=Position(12, 5), end=Position(12, 30), message="LoRA injected after wrap",
                source_line="    model = get_peft_model(model, cfg)")
    base.update(kw)
    return Finding(**base)


FIXED = finding(
    code="FSDP015", name="root-reshard-after-forward", severity=Severity.INFO, start=Position(20, 19), end=Position(20, 47),
    message="extra all-gather", source_line="fully_shard(model, reshard_after_forward=True)",
    fix=Fix(Applicability.SAFE, "Drop the argument", (Edit("", Position(20, 18), Position(20, 47)),)),
)


def sarif(findings):
    buf = io.StringIO()
    write_report(findings, "sarif", buf)
    return json.loads(buf.getvalue())


@pytest.fixture(scope="module")
def validator():
    if not SCHEMA.is_file():
        pytest.skip(f"the SARIF 2.1.0 schema is not available next to the repository ({SCHEMA.name})")
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_validates_against_schema(validator):
    log = sarif([finding(), FIXED, finding(severity=Severity.WARNING, code="FSDP007", name="move-after-wrap")])
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]


def test_empty_run_validates(validator):
    log = sarif([])
    assert not list(validator.iter_errors(log))
    assert log["runs"][0]["results"] == []


def test_schema_catches_a_broken_log(validator):
    """Guards the validator fixture itself: a log with a bad level must fail."""
    log = sarif([finding()])
    log["runs"][0]["results"][0]["level"] = "fatal"
    assert list(validator.iter_errors(log))


def test_results_carry_what_code_scanning_needs():
    log = sarif([finding(), FIXED])
    assert log["version"] == "2.1.0"
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    ids = [r["id"] for r in rules]
    first = run["results"][0]
    assert first["ruleId"] == "FSDP101"
    assert ids[first["ruleIndex"]] == "FSDP101"
    assert first["level"] == "error"
    assert first["message"]["text"] == "LoRA injected after wrap"
    loc = first["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "src/train.py"
    assert loc["region"] == {"startLine": 12, "startColumn": 5, "endLine": 12, "endColumn": 30,
                             "snippet": {"text": "    model = get_peft_model(model, cfg)"}}
    assert first["partialFingerprints"]
    assert "fixes" not in first
    fixed = run["results"][1]
    assert fixed["level"] == "note"
    change = fixed["fixes"][0]["artifactChanges"][0]
    assert change["artifactLocation"]["uri"] == "src/train.py"
    assert change["replacements"][0]["deletedRegion"] == {"startLine": 20, "startColumn": 18, "endLine": 20, "endColumn": 47}
    for rule in rules:
        assert {"id", "name", "shortDescription", "fullDescription", "help", "helpUri", "defaultConfiguration"} <= set(rule)


def test_absolute_paths_become_repo_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    log = sarif([finding(filename=str(tmp_path / "pkg" / "train.py"))])
    uri = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == "pkg/train.py"


def test_fingerprint_survives_line_moves_but_not_code_changes():
    def fp(f):
        return sarif([f])["runs"][0]["results"][0]["partialFingerprints"]

    moved = finding(start=Position(40, 9), end=Position(40, 34), source_line="        model = get_peft_model(model,  cfg)")
    assert fp(finding()) == fp(moved)
    assert fp(finding()) != fp(finding(source_line="    model = get_peft_model(other, cfg)"))


def test_every_registered_rule_has_a_descriptor():
    rules = sarif([])["runs"][0]["tool"]["driver"]["rules"]
    registered = all_rules()
    assert [r["id"] for r in rules] == [r.code for r in registered]
    for desc, rule in zip(rules, registered):
        assert desc["name"] == rule.name
        assert desc["helpUri"].endswith(f"/{rule.code}.md")
        assert desc["defaultConfiguration"]["level"] == {"error": "error", "warning": "warning", "info": "note"}[rule.severity.value]


def test_cli_sarif_output_validates(validator, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from fsdplint.cli import main

    (tmp_path / "train.py").write_text(
        "from peft import get_peft_model\n"
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
        "model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)\n"
        "model = get_peft_model(model, lora_config)\n"
    )
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["check", "--isolated", "--select", "FSDP101", "--output-format", "sarif", "."], catch_exceptions=False)
    assert res.exit_code == 1
    log = json.loads(res.stdout)
    assert not list(validator.iter_errors(log))
    (result,) = log["runs"][0]["results"]
    assert result["ruleId"] == "FSDP101"
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "train.py"
    assert result["fixes"]
