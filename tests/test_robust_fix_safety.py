"""`--fix` never corrupts a file: all-or-nothing, atomic, and faithful to encoding, BOM, newlines and mode."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest
from click.testing import CliRunner
from robust_support import BUGGY, extra_rule

from fsdplint import cli, engine
from fsdplint.cli import main


# A rule with deliberately bad fixes, keyed on names in the linted file:
#   marker_a -> marker_b (fine), marker_b -> "(((" (does not parse),
#   grow -> grow + 1 (never converges), to_arrow -> '→' (not encodable in latin-1).
MARKER_RULE = """
class MarkerFix(Rule):
    code = "FSDP996"
    name = "marker-fix"
    severity = Severity.WARNING
    needs_fsdp = False  # about the engine, not about FSDP: runs on any file
    summary = "Offers deliberately bad fixes for names that start with marker_, grow or to_arrow."
    fix = Applicability.SAFE

    def check(self, ctx):
        replacements = {"marker_a": "marker_b", "marker_b": "(((", "grow": "grow + 1", "to_arrow": "'\\u2192'"}

        class Names(cst.CSTVisitor):
            def visit_Name(self, node):
                new = replacements.get(node.value)
                if new is not None:
                    ctx.report(node, f"{node.value} must go", fix=FixSpec(Applicability.SAFE, "replace", (Replace(node, new),)))

        ctx.module.visit(Names())
"""


@pytest.fixture
def marker_rule(tmp_path):
    with extra_rule(tmp_path, "fsdp996_marker_fix", MARKER_RULE):
        yield


def run(*args, input=None):
    r = CliRunner().invoke(main, ["--isolated", *args], input=input)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    return r


def leftovers(d):
    """Temporary files a fix left behind."""
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".fsdplint"))


def test_a_fix_that_breaks_the_syntax_leaves_the_file_untouched(marker_rule, tmp_path):
    p = tmp_path / "t.py"
    data = b"import peft\nx = marker_b\n"
    p.write_bytes(data)
    r = run(str(p), "--fix")
    assert p.read_bytes() == data
    assert r.exit_code == 1
    err = [line for line in r.output.splitlines() if line.startswith("fsdplint: error:")]
    assert len(err) == 1 and str(p) in err[0] and "FSDP996" in err[0] and "does not parse" in err[0]
    # The finding is still reported, at its place in the file on disk.
    assert f"{p}:2:5: FSDP996" in r.output
    assert leftovers(tmp_path) == []


def test_all_or_nothing_when_a_later_pass_breaks(marker_rule, tmp_path):
    # Pass 1 (marker_a -> marker_b) is fine; pass 2 (marker_b -> "(((") is not: nothing is written.
    p = tmp_path / "t.py"
    data = b"import peft\nx = marker_a\n"
    p.write_bytes(data)
    r = run(str(p), "--fix")
    assert r.exit_code == 1 and "does not parse" in r.output
    assert p.read_bytes() == data
    assert f"{p}:2:5: FSDP996 [*] [warning] marker_a must go" in r.output
    # --diff and stdin refuse the same way.
    r = run(str(p), "--diff")
    assert r.exit_code == 1 and "+x =" not in r.output
    r = run("-", "--fix", input=data.decode())
    assert r.exit_code == 1 and "(((" not in r.output


def test_fixes_that_never_converge_are_bounded_and_refused(marker_rule, tmp_path):
    p = tmp_path / "t.py"
    p.write_text("import peft\nx = grow\n")
    r = run(str(p), "--fix")
    assert r.exit_code == 1
    assert f"did not converge after {engine.MAX_FIX_PASSES} passes" in r.output and "FSDP996" in r.output
    assert p.read_text() == "import peft\nx = grow\n"


def test_unencodable_fix_in_a_latin1_file_is_refused(marker_rule, tmp_path):
    p = tmp_path / "t.py"
    data = "# -*- coding: latin-1 -*-\nimport peft\ns = 'café'\nx = to_arrow\n".encode("latin-1")
    p.write_bytes(data)
    r = run(str(p), "--fix")
    assert r.exit_code == 1
    assert f"{p}: the fixed code cannot be written in the file's encoding (iso-8859-1)" in r.output
    assert p.read_bytes() == data
    assert f"{p}:4:5: FSDP996" in r.output  # still reported: it was not fixed


def test_latin1_file_with_cookie_round_trips(tmp_path):
    p = tmp_path / "t.py"
    src = "# -*- coding: latin-1 -*-\n# Ajusté pour la mémoire\n" + BUGGY
    p.write_bytes(src.encode("latin-1"))
    r = run(str(p), "--fix", "--unsafe-fixes", "--select", "FSDP101")
    assert r.exit_code == 0, r.output
    fixed = p.read_bytes().decode("latin-1")
    assert fixed.startswith("# -*- coding: latin-1 -*-\n# Ajusté pour la mémoire\n")
    assert fixed.index("get_peft_model(model") < fixed.index("FSDP(model")
    with pytest.raises(UnicodeDecodeError):
        p.read_bytes().decode("utf-8")  # still latin-1, not re-encoded


def test_mixed_newlines_and_bom_are_kept_line_by_line(tmp_path):
    p = tmp_path / "t.py"
    lines = BUGGY.splitlines(keepends=True)
    # CRLF on odd lines only; the two swapped statements (6, 7) have different endings.
    mixed = "".join(ln.replace("\n", "\r\n") if i % 2 else ln for i, ln in enumerate(lines))
    p.write_bytes(b"\xef\xbb\xbf" + mixed.encode())
    r = run(str(p), "--fix", "--unsafe-fixes", "--select", "FSDP101")
    assert r.exit_code == 0, r.output
    data = p.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf") and data.count(b"\xef\xbb\xbf") == 1
    body = data[3:].decode()
    assert body.count("\r\n") == mixed.count("\r\n")
    assert body.count("\n") == mixed.count("\n")
    assert body.replace("\r\n", "\n").index("get_peft_model(model") < body.replace("\r\n", "\n").index("FSDP(model")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")
def test_mode_is_kept(tmp_path):
    p = tmp_path / "t.py"
    p.write_text(BUGGY)
    p.chmod(0o750)
    assert run(str(p), "--fix", "--unsafe-fixes", "--select", "FSDP101").exit_code == 0
    assert stat.S_IMODE(p.stat().st_mode) == 0o750
    assert "get_peft_model(model, LoraConfig" in p.read_text().split("FSDP(model")[0]


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_fixing_through_a_symlink_updates_the_target_and_keeps_the_link(tmp_path):
    real = tmp_path / "real.py"
    real.write_text(BUGGY)
    link = tmp_path / "link.py"
    link.symlink_to(real)
    assert run(str(link), "--fix", "--unsafe-fixes", "--select", "FSDP101").exit_code == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text().index("get_peft_model(model") < real.read_text().index("FSDP(model")
    assert leftovers(tmp_path) == []


def test_file_changed_on_disk_while_fixing_is_left_alone(tmp_path, monkeypatch):
    p = tmp_path / "t.py"
    p.write_text(BUGGY)
    edited = BUGGY + "# saved by the editor meanwhile\n"
    real_fix_text = engine.fix_text

    def fix_text_while_someone_saves(*args, **kwargs):
        out = real_fix_text(*args, **kwargs)
        p.write_text(edited)  # the concurrent write, between our read and our write
        return out

    monkeypatch.setattr(engine, "fix_text", fix_text_while_someone_saves)
    r = run(str(p), "--fix", "--unsafe-fixes")
    assert r.exit_code == 1
    assert f"{p}: the file changed on disk while it was being fixed; left unchanged" in r.output
    assert p.read_text() == edited
    assert leftovers(tmp_path) == []


def test_atomic_write_with_a_stale_original(tmp_path):
    p = tmp_path / "t.py"
    p.write_bytes(b"new contents\n")
    err = cli._atomic_write(p, b"fixed\n", b"old contents\n")
    assert err and "changed on disk" in err
    assert p.read_bytes() == b"new contents\n"
    assert cli._atomic_write(p, b"fixed\n", b"new contents\n") is None
    assert p.read_bytes() == b"fixed\n" and leftovers(tmp_path) == []


def test_a_failed_rename_leaves_the_file_and_no_temp_file(tmp_path, monkeypatch):
    p = tmp_path / "t.py"
    p.write_text(BUGGY)

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    r = run(str(p), "--fix", "--unsafe-fixes")
    assert r.exit_code == 2
    assert f"{p}: cannot write the fixed file: No space left on device" in r.output
    assert p.read_text() == BUGGY and leftovers(tmp_path) == []


def test_fix_twice_is_the_same_as_once_on_every_fix_fixture(tmp_path, fixtures_dir):
    """Every shipped fix input: the second --fix run changes nothing and reports no fix applied."""
    ins = sorted((fixtures_dir / "fixes").glob("*.in.py"))
    assert ins
    for src in ins:
        p = tmp_path / src.name
        p.write_bytes(src.read_bytes())
    once = run(str(tmp_path), "--fix", "--unsafe-fixes", "--exit-zero")
    assert once.exit_code == 0, once.output
    after_once = {p.name: p.read_bytes() for p in tmp_path.glob("*.py")}
    assert any(after_once[s.name] != s.read_bytes() for s in ins)
    twice = run(str(tmp_path), "--fix", "--unsafe-fixes", "--output-format", "json", "--exit-zero")
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.py")} == after_once
    assert all(f["fix"] is None or f["fix"]["applicability"] == "display" for f in json.loads(twice.stdout))
