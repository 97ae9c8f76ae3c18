"""SARIF 2.1.0 output, validated against the official schema."""

from __future__ import annotations

import dataclasses
import io
import json
import re
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


def sarif(findings, all_rules=False):
    buf = io.StringIO()
    write_report(findings, "sarif", buf, all_rules=all_rules)
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


def test_only_rules_with_results_are_described_by_default():
    log = sarif([finding(), FIXED])
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert sorted(r["id"] for r in rules) == ["FSDP015", "FSDP101"]
    for res in log["runs"][0]["results"]:
        assert rules[res["ruleIndex"]]["id"] == res["ruleId"]
    assert sarif([])["runs"][0]["tool"]["driver"]["rules"] == []
    # The report of a few results is small: no catalog text of rules that did not fire.
    assert len(json.dumps(log)) < len(json.dumps(sarif([finding(), FIXED], all_rules=True))) / 5


def test_sarif_all_rules_from_the_command_line(tmp_path):
    from click.testing import CliRunner

    from fsdplint.cli import main

    (tmp_path / "t.py").write_text("import os\n")
    for flags, n in (((), 0), (("--sarif-all-rules",), len(all_rules()))):
        r = CliRunner().invoke(main, ["--isolated", "--no-cache", str(tmp_path / "t.py"), "--output-format", "sarif", *flags])
        assert r.exit_code == 0, r.output
        assert len(json.loads(r.output)["runs"][0]["tool"]["driver"]["rules"]) == n


def test_every_registered_rule_has_a_descriptor():
    rules = sarif([], all_rules=True)["runs"][0]["tool"]["driver"]["rules"]
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


# RFC 3986 relative-ref (what `"format": "uri-reference"` means for a relative path): unreserved, sub-delims,
# ":" and "@" and valid %XX escapes only, and no ":" before the first "/" (it would read as a scheme).
_PCHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})"
_PCHAR_NC = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=@]|%[0-9A-Fa-f]{2})"  # no colon: the first segment
_RELATIVE_REF = re.compile(rf"(?:{_PCHAR_NC}+)?(?:/{_PCHAR}*)*")


def _uri_reference_ok(value) -> bool:
    if not isinstance(value, str):
        return True
    if re.match(r"[A-Za-z][A-Za-z0-9+.\-]*:", value):  # absolute (file:///...)
        return value.startswith("file:///") and re.fullmatch(rf"file://(?:/{_PCHAR}*)+", value) is not None
    return _RELATIVE_REF.fullmatch(value) is not None


@pytest.fixture(scope="module")
def strict_validator():
    if not SCHEMA.is_file():
        pytest.skip(f"the SARIF 2.1.0 schema is not available next to the repository ({SCHEMA.name})")
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    checker = jsonschema.FormatChecker()
    checker.checks("uri-reference")(_uri_reference_ok)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=checker)


@pytest.mark.parametrize("name,expected", [
    ("my scripts/train lora.py", "my%20scripts/train%20lora.py"),
    ("runs/a,b/train.py", "runs/a%2Cb/train.py"),
    ("exp:1/train.py", "exp%3A1/train.py"),
    ("100%/train.py", "100%25/train.py"),
    ("src/train#2.py", "src/train%232.py"),
])
def test_uris_are_percent_encoded_relative_references(strict_validator, name, expected):
    log = sarif([finding(filename=name), dataclasses.replace(FIXED, filename=name)])
    results = log["runs"][0]["results"]
    assert results[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == expected
    assert results[1]["fixes"][0]["artifactChanges"][0]["artifactLocation"]["uri"] == expected
    errors = [f"{list(e.path)}: {e.message}" for e in strict_validator.iter_errors(log)]
    assert not errors, errors


def test_strict_validator_rejects_an_unencoded_uri(strict_validator):
    """Guards the format check itself: the URIs fsdplint wrote before percent-encoding fail it."""
    log = sarif([finding()])
    for raw in ("my scripts/train.py", "exp:1/train.py", "100%/train.py"):
        log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] = raw
        assert list(strict_validator.iter_errors(log)), raw


def test_absolute_path_outside_the_working_directory_is_a_file_uri(strict_validator, tmp_path, monkeypatch):
    other = tmp_path / "work dir"
    other.mkdir()
    monkeypatch.chdir(other)
    log = sarif([finding(filename=str(tmp_path / "elsewhere, 1" / "train.py"))])
    uri = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri.startswith("file:///") and " " not in uri and "%2C%201/train.py" in uri
    assert not list(strict_validator.iter_errors(log))
