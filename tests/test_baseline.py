"""Baselines: adopt the linter on a legacy codebase without fixing everything first."""

from __future__ import annotations

import json

import pytest

from fsdplint.baseline import load_baseline, write_baseline
from fsdplint.errors import UsageError
from fsdplint.findings import Finding, Position, Severity


def finding(row=3, code="FSDP101", filename="train.py", line="model = get_peft_model(model, cfg)", message="LoRA after wrap"):
    return Finding(code=code, name="x", severity=Severity.ERROR, filename=filename, start=Position(row, 1),
                   end=Position(row, 10), message=message, source_line=line)


def test_recorded_findings_are_suppressed_after_unrelated_edits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "fsdplint-baseline.json"
    assert write_baseline([finding(), finding(code="FSDP007", line="model.to('cuda')", row=9)], base) == 2
    # Lines were added above; indentation changed.
    later = [finding(row=13, line="    model = get_peft_model(model,   cfg)"), finding(code="FSDP007", line="model.to('cuda')", row=19)]
    kept, suppressed = load_baseline(base).filter(later)
    assert kept == [] and suppressed == 2


def test_new_and_changed_findings_are_reported(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "b.json"
    write_baseline([finding()], base)
    new_code = finding(code="FSDP007")
    changed_line = finding(line="model = get_peft_model(other, cfg)")
    other_file = finding(filename="eval.py")
    kept, suppressed = load_baseline(base).filter([finding(), new_code, changed_line, other_file])
    assert suppressed == 1
    assert kept == sorted([new_code, changed_line, other_file], key=Finding.sort_key)


def test_duplicates_are_counted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "b.json"
    write_baseline([finding(row=3), finding(row=8)], base)
    assert json.loads(base.read_text())["findings"][0]["count"] == 2
    kept, suppressed = load_baseline(base).filter([finding(row=3), finding(row=8), finding(row=20)])
    assert suppressed == 2 and [f.start.row for f in kept] == [20]


def test_paths_are_relative_to_the_baseline_file(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "ci" / "baseline.json"
    base.parent.mkdir()
    write_baseline([finding(filename="src/train.py")], base)
    assert json.loads(base.read_text())["findings"][0]["path"] == "../src/train.py"
    # Same file, named from another working directory.
    monkeypatch.chdir(tmp_path / "src")
    kept, suppressed = load_baseline(base).filter([finding(filename="train.py")])
    assert (kept, suppressed) == ([], 1)


def test_findings_without_source_line_are_keyed_by_message(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = tmp_path / "b.json"
    write_baseline([finding(filename="cfg.json", line="", message="unit 3 mixes dtypes")], base)
    kept, _ = load_baseline(base).filter([finding(filename="cfg.json", line="", message="unit 4 mixes dtypes")])
    assert len(kept) == 1
    kept, _ = load_baseline(base).filter([finding(filename="cfg.json", line="", row=7, message="unit 3 mixes dtypes")])
    assert kept == []


@pytest.mark.parametrize("text, needle", [
    (None, "baseline file not found"),
    ('{"findings": [', "b.json:1:"),
    ('{"findings": []}', "not an fsdplint baseline"),
    ('{"fsdplint-baseline": 1, "findings": [{"code": "X"}]}', "entry 1"),
])
def test_bad_baseline_files_are_one_line_errors(tmp_path, text, needle):
    base = tmp_path / "b.json"
    if text is not None:
        base.write_text(text)
    with pytest.raises(UsageError) as err:
        load_baseline(base)
    assert needle in str(err.value) and str(base) in str(err.value) and "\n" not in str(err.value)
