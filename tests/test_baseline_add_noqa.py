"""`--add-noqa`: silence existing findings in place."""

from __future__ import annotations

from fsdplint.add_noqa import add_noqa, add_noqa_to_text
from fsdplint.findings import Finding, Position, Severity


def finding(filename, row, code="FSDP101"):
    return Finding(code=code, name="x", severity=Severity.ERROR, filename=str(filename), start=Position(row, 1),
                   end=Position(row, 5), message="m")


def test_appends_comment_and_merges_codes_on_one_line():
    text = "a = 1\nmodel = get_peft_model(model, cfg)\n"
    new, n = add_noqa_to_text(text, {2: {"FSDP101", "FSDP007"}})
    assert new == "a = 1\nmodel = get_peft_model(model, cfg)  # noqa: FSDP007, FSDP101\n"
    assert n == 1


def test_extends_existing_noqa_and_keeps_other_comments():
    text = "x = f()  # noqa: FSDP007 -- reviewed\ny = g()  # type: ignore\nz = h()  # noqa\n"
    new, n = add_noqa_to_text(text, {1: {"FSDP101"}, 2: {"FSDP101"}, 3: {"FSDP101"}})
    assert new.splitlines() == [
        "x = f()  # noqa: FSDP007, FSDP101 -- reviewed",
        "y = g()  # type: ignore  # noqa: FSDP101",
        "z = h()  # noqa",
    ]
    assert n == 2


def test_already_silenced_line_is_unchanged():
    text = "x = f()  # noqa: FSDP101\n"
    assert add_noqa_to_text(text, {1: {"FSDP101"}}) == (text, 0)


def test_multiline_string_gets_comment_after_it_ends():
    text = 'x = f("""\nstart\n""")\n'
    new, _ = add_noqa_to_text(text, {1: {"FSDP101"}})
    assert new == 'x = f("""\nstart\n""")  # noqa: FSDP101\n'
    compile(new, "<test>", "exec")


def test_crlf_line_endings_are_kept(tmp_path):
    path = tmp_path / "t.py"
    path.write_bytes(b"a = 1\r\nb = 2\r\n")
    assert add_noqa([finding(path, 2)]) == 1
    assert path.read_bytes() == b"a = 1\r\nb = 2  # noqa: FSDP101\r\n"


def test_files_are_edited_and_non_python_files_skipped(tmp_path):
    py = tmp_path / "train.py"
    py.write_text("import torch\nmodel = wrap(model)\n")
    yml = tmp_path / "accelerate.yaml"
    yml.write_text("distributed_type: FSDP\n")
    assert add_noqa([finding(py, 2), finding(py, 2, "FSDP007"), finding(yml, 1)]) == 1
    assert py.read_text() == "import torch\nmodel = wrap(model)  # noqa: FSDP007, FSDP101\n"
    assert yml.read_text() == "distributed_type: FSDP\n"
