"""A finding that one file's lint reports in another file (a launch read from a document leads to a finding
in the accelerate config it names) is shown as the linted files are shown, and once."""

import os

from fsdplint.engine import FileResult
from fsdplint.findings import Finding, Position, Related, Severity
from fsdplint.relocate import relocate


def _f(filename, row, code="FSDP601", message="accelerate 1.6 refuses FSDP2 with FULL_STATE_DICT.", related=()):
    return Finding(code=code, name="known-bug-at-version", severity=Severity.WARNING, filename=filename,
                   start=Position(row, 3), end=Position(row, 9), message=message, related=list(related))


def test_a_finding_in_another_linted_file_is_shown_relative_and_reported_once(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "configs").mkdir()
    (tmp_path / "docs" / "train.md").write_text("```bash\naccelerate launch --config_file configs/fsdp.yaml t.py\n```\n")
    (tmp_path / "configs" / "fsdp.yaml").write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n")
    monkeypatch.chdir(tmp_path)
    doc = os.path.join("docs", "train.md")
    cfg = os.path.join("configs", "fsdp.yaml")
    absolute_cfg = str(tmp_path.resolve() / cfg)
    absolute_doc = str(tmp_path.resolve() / doc)
    launch = Related(absolute_doc, Position(2, 1), Position(2, 60), "the launch that leads to this finding")
    from_doc = _f(absolute_cfg, 3, message=f"accelerate 1.6 refuses FSDP2 (when launched by {absolute_doc}:2)",
                  related=[launch])
    own = _f(cfg, 3)
    results = relocate([FileResult(doc, [from_doc]), FileResult(cfg, [own])])

    by_name = {r.filename: r.findings for r in results}
    assert by_name[doc] == []  # not reported a second time under the document
    assert len(by_name[cfg]) == 1
    kept = by_name[cfg][0]
    assert kept.filename == cfg
    assert [x.filename for x in kept.related] == [doc]  # the launch stays visible, named as linted files are


def test_a_finding_in_an_unlinted_file_stays_with_its_linter_but_is_shown_relative(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "fsdp.yaml").write_text("distributed_type: FSDP\n")
    (tmp_path / "README.md").write_text("x\n")
    monkeypatch.chdir(tmp_path)
    absolute_cfg = str(tmp_path.resolve() / "configs" / "fsdp.yaml")
    f = _f(absolute_cfg, 1, message=f"see {tmp_path.resolve()}{os.sep}README.md:1")
    [r] = relocate([FileResult("README.md", [f])])
    assert r.findings[0].filename == os.path.join("configs", "fsdp.yaml")
    assert str(tmp_path) not in r.findings[0].message and str(tmp_path.resolve()) not in r.findings[0].message


def test_two_linted_files_leading_to_one_finding_in_an_unlinted_file_give_it_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("a.md", "b.md", "pyproject.toml"):
        (tmp_path / name).write_text("x\n")
    la = Related("a.md", Position(3, 1), Position(3, 9), "the launch that leads to this finding")
    lb = Related("b.md", Position(5, 1), Position(5, 9), "the launch that leads to this finding")
    results = relocate([FileResult("a.md", [_f("pyproject.toml", 4, related=[la])]),
                        FileResult("b.md", [_f("pyproject.toml", 4, related=[lb])])])
    found = [f for r in results for f in r.findings]
    assert len(found) == 1
    assert {x.filename for x in found[0].related} == {"a.md", "b.md"}
