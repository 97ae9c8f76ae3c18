"""Broken, half-written and hostile files: one clear line naming the file (and line), never a traceback."""

from __future__ import annotations

import json
import os
import sys

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

RULE_TRIGGER = "import peft\n"


def lint(*args, input=None):
    r = CliRunner().invoke(main, ["--isolated", "--output-format", "json", *args], input=input)
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def findings(r):
    return json.loads(r.output) if r.output.strip().startswith("[") else []


CASES = {
    "empty.py": (b"", None, None),
    "comments.py": (b"# only\n# comments\n", None, None),
    "syntax_top.py": (b"import peft\ndef f(:\n    pass\n", "FSDP900", 2),
    "syntax_end.py": (b"import peft\nx = 1\ny = (\n", "FSDP900", 3),
    "syntax_indent.py": (b"import peft\nif x:\ny = 1\n", "FSDP900", 3),
    "nul.py": (b"import peft\nx = 1\x00\n", "FSDP900", None),
    "binary.py": (bytes(range(256)) * 4, "FSDP903", None),
    "latin1_cookie.py": ("# -*- coding: latin-1 -*-\nimport peft\ns = 'é'\n".encode("latin-1"), None, None),
    "latin1_no_cookie.py": ("import peft\ns = 'é'\n".encode("latin-1"), "FSDP903", 2),
    "bom.py": (b"\xef\xbb\xbf" + RULE_TRIGGER.encode() + b"x = 1\n", None, None),
    "crlf.py": (b"import peft\r\nx = 1\r\n", None, None),
    "mixed_newlines.py": (b"import peft\r\nx = 1\nif x:\r\n    y = 2\n", None, None),
    "tabs.py": (b"import peft\nif x:\n\ty = 1\n", None, None),
    "deep_parens.py": (("import peft\nx = " + "(" * 3000 + "1" + ")" * 3000 + "\n").encode(), "FSDP900", 2),
    # Python 3.12 f-strings (PEP 701) are valid code even where fsdplint runs on an older interpreter.
    "fstring_pep701.py": (b'import peft\nd = {"k": 1}\nprint(f"{d["k"]} {str(p / "ckpt")}")\n', None, None),
    "fstring_pep701_then_error.py": (b'import peft\nx = f"{d["k"]}"\ny = (\n', "FSDP900", None),
    "deep_indent.py": (("import peft\n" + "".join(" " * i + f"if x{i}:\n" for i in range(120)) + " " * 120 + "pass\n").encode(), "FSDP900", None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_matrix(tmp_path, name):
    data, code, line = CASES[name]
    p = tmp_path / name
    p.write_bytes(data)
    r = lint(str(p))
    got = findings(r)
    if code is None:
        assert got == [] and r.exit_code == 0, got
        return
    assert r.exit_code == 1
    assert [f["code"] for f in got] == [code]
    assert got[0]["filename"].endswith(name)
    assert "\n" not in got[0]["message"]
    if line is not None:
        assert got[0]["location"]["row"] == line


def _zip_bytes() -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00." * 50)
    return buf.getvalue()


def _safetensors_bytes() -> bytes:
    header = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    return len(header).to_bytes(8, "little") + header + b"\x00\x00\x80?"


# A non-text file is named for what it is, not as a "bad encoding declaration".
WHAT_IT_IS = {
    "utf16_bom.py": (("import peft\n" + "x = 1\n" * 5).encode("utf-16"), "UTF-16 LE text (byte-order mark FF FE)"),
    "utf16_be_bom.py": (b"\xfe\xff" + "import peft\n".encode("utf-16-be"), "UTF-16 BE text (byte-order mark FE FF)"),
    "utf16_no_bom.py": (("import peft\n" + "x = 1\n" * 5).encode("utf-16-le"), "UTF-16 LE text without a byte-order mark"),
    "utf32_bom.py": ("import peft\n".encode("utf-32"), "UTF-32 LE text"),
    "checkpoint.py": (_zip_bytes(), "a ZIP archive (a torch.save checkpoint"),
    "legacy_pickle.py": (b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01u.", "a Python pickle"),
    "weights.py": (_safetensors_bytes(), "a safetensors file"),
    "random.py": (bytes(range(256)) * 4, "binary data (NUL bytes"),
    "random_no_nul.py": (bytes(range(1, 256)) * 4, "binary data (61% control or non-ASCII bytes"),
}


@pytest.mark.parametrize("name", sorted(WHAT_IT_IS))
def test_non_text_file_says_what_it_is(tmp_path, name):
    data, what = WHAT_IT_IS[name]
    p = tmp_path / name
    p.write_bytes(data)
    r = lint(str(p))
    (f,) = findings(r)
    assert r.exit_code == 1
    assert f["code"] == "FSDP903" and f["filename"].endswith(name)
    assert what in f["message"] and "encoding declaration" not in f["message"], f["message"]
    assert "\n" not in f["message"] and f["location"]["row"] == 1


def test_text_in_another_encoding_says_where_and_how_to_declare_it(tmp_path):
    """Latin-1 text without a coding cookie: which byte on which line, and the two ways out."""
    p = tmp_path / "legacy.py"
    p.write_bytes("import peft\n# r\u00e9sum\u00e9 of the run\nx = 1\n".encode("latin-1"))
    (f,) = findings(lint(str(p)))
    assert f["code"] == "FSDP903" and f["location"]["row"] == 2
    assert "not UTF-8 (byte 0xE9 on line 2)" in f["message"] and "coding cookie" in f["message"]
    assert "encoding declaration:" not in f["message"]


def test_text_with_a_stray_nul_is_still_a_syntax_error(tmp_path):
    """One NUL in otherwise UTF-8 code is a broken source file (FSDP900), not a binary one."""
    p = tmp_path / "stray.py"
    p.write_bytes(b"import peft\nx = 'caf\xc3\xa9'\x00\n")
    (f,) = findings(lint(str(p)))
    assert f["code"] == "FSDP900"


def test_one_bad_file_does_not_stop_the_others(tmp_path):
    (tmp_path / "a_bad.py").write_bytes(b"import peft\ndef f(:\n")
    (tmp_path / "b_binary.py").write_bytes(bytes(range(256)))
    (tmp_path / "c_buggy.py").write_text(
        "import torch.distributed.fsdp as f\nfrom peft import get_peft_model\nfor layer in m.layers:\n    f.fully_shard(layer)\nf.fully_shard(m)\nm = get_peft_model(m, c)\n"
    )
    got = {(os.path.basename(f["filename"]), f["code"]) for f in findings(lint(str(tmp_path)))}
    assert got == {("a_bad.py", "FSDP900"), ("b_binary.py", "FSDP903"), ("c_buggy.py", "FSDP101")}


def test_large_generated_file(tmp_path):
    body = "".join(f"def f{i}(model):\n    x{i} = model.layers[{i}]\n    return x{i}\n" for i in range(75000))
    p = tmp_path / "gen.py"
    p.write_text("import torch.distributed.fsdp as f\nfrom peft import get_peft_model\n" + body
                 + "for layer in m.layers:\n    f.fully_shard(layer)\nf.fully_shard(m)\nm = get_peft_model(m, c)\n")
    assert p.stat().st_size > 5_000_000
    got = findings(lint(str(p)))
    assert [f["code"] for f in got] == ["FSDP101"]


def test_directory_without_python_files(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    r = lint(str(tmp_path))
    assert r.exit_code == 0 and findings(r) == []


def test_missing_path_is_a_usage_error(tmp_path):
    r = CliRunner().invoke(main, ["--isolated", str(tmp_path / "nope.py")])
    assert r.exit_code == 2
    assert r.output.strip().count("\n") == 0 and "nope.py" in r.output


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_symlink_loop_and_dangling_link(tmp_path):
    (tmp_path / "loop1.py").symlink_to(tmp_path / "loop2.py")
    (tmp_path / "loop2.py").symlink_to(tmp_path / "loop1.py")
    (tmp_path / "dangling.py").symlink_to(tmp_path / "nowhere.py")
    for name in ("loop1.py", "dangling.py"):
        r = lint(str(tmp_path / name))
        (f,) = findings(r)
        assert f["code"] == "FSDP903" and f["filename"].endswith(name)
    # Walking the directory does not follow the loop.
    r = lint(str(tmp_path))
    assert r.exit_code == 1


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root can read any file")
def test_unreadable_file(tmp_path):
    p = tmp_path / "secret.py"
    p.write_text("import peft\n")
    p.chmod(0)
    (f,) = findings(lint(str(p)))
    assert f["code"] == "FSDP903"


def test_stdin_bad_input():
    r = lint("-", "--stdin-filename", "x.py", input="import peft\ndef f(:\n")
    (f,) = findings(r)
    assert f["code"] == "FSDP900" and f["filename"] == "x.py" and f["location"]["row"] == 2
