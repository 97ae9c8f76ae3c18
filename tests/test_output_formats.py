"""The report formats, as a user (or a CI system) reads them."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET

import pytest

from fsdplint.findings import Applicability, Edit, Finding, Fix, Position, Severity, finding_from_json
from fsdplint.output import FORMATS, RunSummary, write_report

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def make(code="FSDP101", sev=Severity.ERROR, filename="train.py", row=3, col=5, end_col=20, msg="LoRA injected after wrap", fix=None, line="    model = get_peft_model(model, cfg)"):
    return Finding(
        code=code,
        name={"FSDP101": "lora-after-fsdp-wrap", "FSDP007": "move-after-wrap", "FSDP015": "root-reshard-after-forward"}.get(code, "some-rule"),
        severity=sev,
        filename=filename,
        start=Position(row, col),
        end=Position(row, end_col),
        message=msg,
        fix=fix,
        source_line=line,
    )


SAFE_FIX = Fix(Applicability.SAFE, "Drop `reshard_after_forward=True`", (Edit("", Position(7, 20), Position(7, 48)),))
UNSAFE_FIX = Fix(Applicability.UNSAFE, "Move `.to()` before wrapping", (Edit("", Position(9, 1), Position(9, 20)),))


def sample():
    return [
        make(filename="b.py", row=10),
        make(),
        make(code="FSDP015", sev=Severity.INFO, row=7, col=20, end_col=48, msg="extra all-gather", fix=SAFE_FIX, line="fully_shard(model, reshard_after_forward=True)"),
        make(code="FSDP007", sev=Severity.WARNING, row=9, col=1, msg="moved after wrap", fix=UNSAFE_FIX, line="model.to('cuda')"),
    ]


def render(findings, fmt, **kw):
    buf = io.StringIO()
    write_report(findings, fmt, buf, **kw)
    return buf.getvalue()


def test_concise_lines_sorted_with_summary():
    out = render(sample(), "concise").splitlines()
    assert out[:4] == [
        # One line each: the message's first clause, then the fix's title when the finding has a fix.
        "b.py:10:5: FSDP101 [error] LoRA injected after wrap.",
        "train.py:3:5: FSDP101 [error] LoRA injected after wrap.",
        "train.py:7:20: FSDP015 [*] [info] extra all-gather. Drop `reshard_after_forward=True`.",
        "train.py:9:1: FSDP007 [-] [warning] moved after wrap. Move `.to()` before wrapping.",
    ]
    assert out[4] == "2 errors, 1 warning, 1 info in 2 files; 1 fixable with --fix, 1 more fixable with --unsafe-fixes"
    assert len(out) == 5


def test_summary_line_uses_run_summary_and_plurals():
    findings = [make(), make(row=4), make(filename="b.py"), make(code="FSDP007", sev=Severity.WARNING)]
    out = render(findings, "concise", summary=RunSummary(files_checked=5, fixable_safe=2))
    assert out.splitlines()[-1] == "3 errors, 1 warning in 2 files; 2 fixable with --fix"


def test_only_unsafe_fixes_are_named_as_such():
    out = render([make(code="FSDP007", sev=Severity.WARNING, fix=UNSAFE_FIX)], "concise")
    assert out.splitlines()[-1] == "1 warning in 1 file; 1 fixable with --unsafe-fixes"


def test_clean_run_says_all_checks_passed():
    assert render([], "concise") == "All checks passed!\n"
    assert render([], "full", summary=RunSummary(files_checked=2, fixed=3)) == "Fixed 3 findings; all checks passed!\n"


def test_no_colour_unless_asked():
    assert "\x1b[" not in render(sample(), "concise")
    assert "\x1b[" not in render(sample(), "full")
    coloured = render(sample(), "concise", color=True)
    assert "\x1b[" in coloured
    assert ANSI.sub("", coloured) == render(sample(), "concise")


def test_full_shows_source_line_with_caret_under_span():
    out = render([make(col=13, end_col=27)], "full")
    lines = out.splitlines()
    src = next(i for i, ln in enumerate(lines) if "get_peft_model" in ln)
    assert lines[src] == "3 |     model = get_peft_model(model, cfg)"
    caret = lines[src + 1]
    # The caret starts under `get_peft_model` and is as wide as the span.
    start = caret.index("^")
    assert lines[src][start:].startswith("get_peft_model")
    assert caret.count("^") == 14
    assert "https://github.com/fsdplint/fsdplint/blob/main/docs/rules/FSDP101.md" in out


def test_full_multiline_span_underlines_to_end_of_line_and_shows_fix():
    f = make(code="FSDP015", sev=Severity.INFO, row=7, col=1, end_col=1, fix=SAFE_FIX, line="fully_shard(model, reshard_after_forward=True)")
    f.end = Position(9, 2)
    out = render([f], "full")
    assert "^" * len("fully_shard(model, reshard_after_forward=True)") in out
    assert "= fix: Drop `reshard_after_forward=True`" in out


def test_full_without_source_line_still_reports():
    out = render([make(line="")], "full")
    assert out.startswith("train.py:3:5: FSDP101 [error] LoRA injected after wrap\n")
    assert "^" not in out


def test_json_is_ruff_compatible_and_round_trips():
    findings = sample()
    data = json.loads(render(findings, "json"))
    assert [d["filename"] for d in data] == ["b.py", "train.py", "train.py", "train.py"]
    first = data[0]
    assert set(first) >= {"code", "message", "filename", "location", "end_location", "fix", "url"}
    assert first["location"] == {"row": 10, "column": 5}
    fixed = next(d for d in data if d["code"] == "FSDP015")
    assert fixed["fix"]["applicability"] == "safe"
    assert fixed["fix"]["edits"][0]["location"] == {"row": 7, "column": 20}
    back = [finding_from_json(d) for d in data]
    assert [b.sort_key() for b in back] == sorted(f.sort_key() for f in findings)
    assert render([], "json").strip() == "[]"


def test_json_lines_one_object_per_line():
    out = render(sample(), "json-lines")
    lines = out.splitlines()
    assert len(lines) == 4
    assert [json.loads(ln)["code"] for ln in lines] == ["FSDP101", "FSDP101", "FSDP015", "FSDP007"]
    assert render([], "json-lines") == ""


def test_statistics_counts_per_code():
    out = render(sample() + [make(row=30)], "concise", statistics=True).splitlines()
    assert out[0].split("\t") == ["3", "FSDP101", "[ ] lora-after-fsdp-wrap"]
    assert out[1].split("\t")[:2] == ["1", "FSDP007"]
    assert out[1].endswith("[-] move-after-wrap")
    assert out[2].split("\t") == ["1", "FSDP015", "[*] root-reshard-after-forward"]
    # No per-finding lines in statistics mode.
    assert not any(ln.startswith("train.py:") for ln in out)


def test_show_fixes_lists_available_fixes():
    out = render(sample(), "concise", show_fixes=True, summary=RunSummary(fixed=2, fixable_safe=1, fixable_unsafe=1))
    assert "train.py:7:20: FSDP015 (safe fix) Drop `reshard_after_forward=True`" in out
    assert "train.py:9:1: FSDP007 (unsafe fix) Move `.to()` before wrapping" in out
    assert out.splitlines()[-1].startswith("Fixed 2 findings; remaining: 2 errors, 1 warning, 1 info in 2 files")


def test_junit_is_valid_xml_with_one_failure_per_finding():
    root = ET.fromstring(render(sample(), "junit"))
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert sorted(s.get("name") for s in suites) == ["b.py", "train.py"]
    failures = root.findall(".//testcase/failure")
    assert len(failures) == 4
    assert {f.get("type") for f in failures} == {"FSDP101", "FSDP015", "FSDP007"}
    clean = ET.fromstring(render([], "junit"))
    assert clean.findall(".//failure") == [] and len(clean.findall(".//testcase")) == 1


def test_junit_escapes_markup_in_messages():
    root = ET.fromstring(render([make(msg='use <model> & "cfg"')], "junit"))
    assert root.find(".//failure").get("message") == 'use <model> & "cfg"'


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError, match="unknown output format 'xml'"):
        render([], "xml")


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_handles_empty_and_non_ascii(fmt):
    render([], fmt)
    out = render([make(msg="modèle ↯ 100%", filename="dir/trâin.py")], fmt)
    assert out
