"""docs/rules/ is generated from the rule classes and must be up to date."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fsdplint import docs_gen
from fsdplint.registry import all_rules

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "rules"


def test_docs_are_not_stale():
    stale = docs_gen.stale_files(DOCS)
    assert not stale, f"stale generated docs {stale}; run `python -m fsdplint.docs_gen`"


def test_readme_rule_table_is_current():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert docs_gen.render_readme(text) == text, "the README rule table is stale; run `python -m fsdplint.docs_gen`"
    for rule in all_rules():
        assert f"[{rule.code}](docs/rules/{rule.code}.md)" in text


def test_every_rule_has_a_page_and_an_index_row():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    for rule in all_rules():
        path = DOCS / f"{rule.code}.md"
        assert path.is_file(), f"no page for {rule.code}; run `python -m fsdplint.docs_gen`"
        page = path.read_text(encoding="utf-8")
        assert page.splitlines()[2] == f"# {rule.code} {rule.name}"
        assert f"[{rule.code}]({rule.code}.md)" in index


def test_check_mode_detects_edits_and_regeneration_fixes_them(tmp_path):
    out = tmp_path / "rules"
    cmd = [sys.executable, "-m", "fsdplint.docs_gen", "--out", str(out)]
    assert subprocess.run(cmd + ["--check"], capture_output=True).returncode == 1
    subprocess.run(cmd, check=True, capture_output=True)
    assert subprocess.run(cmd + ["--check"], capture_output=True).returncode == 0
    index = out / "index.md"
    index.write_text(index.read_text() + "hand edit\n")
    # A generated page for a rule that no longer exists is stale too.
    (out / "FSDP999.md").write_text(docs_gen.HEADER + "# FSDP999 gone\n")
    (out / "notes.md").write_text("# Hand-written notes\n")
    res = subprocess.run(cmd + ["--check"], capture_output=True, text=True)
    assert res.returncode == 1
    assert "index.md: stale" in res.stdout and "FSDP999.md: stale" in res.stdout
    assert "notes.md" not in res.stdout
    subprocess.run(cmd, check=True, capture_output=True)
    assert not (out / "FSDP999.md").exists() and (out / "notes.md").exists()
    assert "hand edit" not in index.read_text()
