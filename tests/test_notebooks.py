"""Jupyter notebooks linted as users write them: cells joined as one program, magics skipped,
findings at `cell N:row:col`, fixes written back into the cells only."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner

from fsdplint.cli import main

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"


def run(*args):
    return CliRunner().invoke(main, ["--isolated", "--no-cache", *args])


def as_notebook(script: Path, dest: Path) -> Path:
    """The script as a user pastes it into a notebook: a title, an install cell with shell and line
    magics, then one code cell per top-level block (split at the blank-line gaps), each with an output."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells.append(nbformat.v4.new_markdown_cell("# Fine-tuning\nLoRA on FSDP."))
    nb.cells.append(nbformat.v4.new_code_cell("!pip install -q peft\n%load_ext autoreload\n%autoreload 2"))
    for chunk in re.split(r"\n\n\n+", script.read_text()):
        if chunk.strip():
            cell = nbformat.v4.new_code_cell(chunk.strip("\n"))
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ok\n")]
            cell.execution_count = len(nb.cells)
            nb.cells.append(cell)
    nbformat.write(nb, str(dest))
    return dest


def findings(*args):
    r = run(*args, "--output-format", "json")
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.output)


def cell_line(nb_path: Path, cell: int, row: int) -> str:
    nb = json.loads(nb_path.read_text())
    return "".join(nb["cells"][cell - 1]["source"]).splitlines()[row - 1]


@pytest.mark.parametrize("name", ["fsdp2_lora_after_shard_buggy", "fsdp1_lora_eval_buggy", "fsdp2_hsdp_buggy"])
def test_notebook_gets_the_scripts_findings_at_the_same_lines(tmp_path, name):
    script = tmp_path / f"{name}.py"
    shutil.copy(FIXTURES / f"{name}.py", script)
    nb = as_notebook(script, tmp_path / f"{name}.ipynb")
    want = findings(str(script))
    got = findings(str(nb))
    assert want and len(got) == len(want)
    lines = script.read_text().splitlines()
    for w, g in zip(sorted(want, key=lambda f: (f["location"]["row"], f["code"])),
                    sorted(got, key=lambda f: (f["cell"], f["location"]["row"], f["code"]))):
        assert g["code"] == w["code"]
        assert g["location"]["column"] == w["location"]["column"]
        # The cell row is the script's line: the same code, where a notebook user looks for it.
        assert cell_line(nb, g["cell"], g["location"]["row"]) == lines[w["location"]["row"] - 1]
        # Lines the message names are the notebook's own (`cell 4, line 2`), never the joined program's.
        assert re.sub(r"cell \d+, line \d+|line \d+", "L", g["message"]) == re.sub(r"line \d+", "L", w["message"])


def test_concise_output_names_the_cell_as_ruff_does(tmp_path):
    nb = as_notebook(FIXTURES / "fsdp2_lora_after_shard_buggy.py", tmp_path / "train.ipynb")
    r = run(str(nb))
    assert r.exit_code == 1
    assert re.search(r"train\.ipynb:cell \d+:\d+:\d+: FSDP101", r.output), r.output
    assert "All checks passed" not in r.output


def test_fix_writes_back_cells_only_and_the_notebook_stays_valid(tmp_path):
    name = "fsdp1_lora_eval_buggy"
    script = tmp_path / f"{name}.py"
    shutil.copy(FIXTURES / f"{name}.py", script)
    nb_path = as_notebook(script, tmp_path / f"{name}.ipynb")
    before = json.loads(nb_path.read_text())
    assert run(str(script), "--fix", "--unsafe-fixes").exit_code in (0, 1)
    r = run(str(nb_path), "--fix", "--unsafe-fixes")
    assert r.exit_code in (0, 1), r.output
    after_nb = nbformat.read(str(nb_path), as_version=4)
    nbformat.validate(after_nb)
    after = json.loads(nb_path.read_text())
    assert after["metadata"] == before["metadata"] and len(after["cells"]) == len(before["cells"])
    changed = 0
    for b, a in zip(before["cells"], after["cells"]):
        assert a.get("outputs") == b.get("outputs") and a["metadata"] == b["metadata"]
        assert a.get("execution_count") == b.get("execution_count") and a["cell_type"] == b["cell_type"]
        changed += a["source"] != b["source"]
    assert changed, "the fixable findings were fixed"
    # The magics survive the fix, where the user wrote them.
    assert "".join(after["cells"][1]["source"]) == "!pip install -q peft\n%load_ext autoreload\n%autoreload 2"
    # The fixed cells hold the code the fixed script holds.
    code = [ln for c in after["cells"][2:] for ln in "".join(c["source"]).splitlines() if ln.strip()]
    assert code == [ln for ln in script.read_text().splitlines() if ln.strip()]
    # Linting the fixed notebook again finds what linting the fixed script finds.
    assert sorted(f["code"] for f in findings(str(nb_path))) == sorted(f["code"] for f in findings(str(script)))


def test_a_directory_run_finds_notebooks(tmp_path):
    as_notebook(FIXTURES / "fsdp2_lora_after_shard_buggy.py", tmp_path / "explore.ipynb")
    got = findings(str(tmp_path))
    assert {f["filename"].endswith("explore.ipynb") for f in got} == {True}
    assert "FSDP101" in {f["code"] for f in got}


def test_a_json_file_that_is_no_notebook_is_a_one_line_error(tmp_path):
    bad = tmp_path / "broken.ipynb"
    bad.write_text('{"cells": [')
    r = run(str(bad))
    assert r.exit_code == 1
    line = [ln for ln in r.output.splitlines() if "broken.ipynb" in ln]
    assert len(line) == 1 and "not a Jupyter notebook" in line[0] and "Traceback" not in r.output


def test_cell_magics_and_other_languages_are_not_read_as_python(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("%%bash\nfor x in 1 2; do echo $x; done"))
    nb.cells.append(nbformat.v4.new_code_cell("import torch\nx = torch.ones(2)\nx?\nfiles = !ls\nprint(x)"))
    path = tmp_path / "magics.ipynb"
    nbformat.write(nb, str(path))
    r = run(str(path))
    assert r.exit_code == 0, r.output


def test_a_shell_line_continued_with_a_backslash_is_one_magic(tmp_path):
    """`! python prep.py --a 1 \\` with its flags on the next lines (as notebooks that run a
    preprocessing script write it): IPython reads the continued lines into the shell command, so they are
    no Python and no SyntaxError; the Python cell after it is still read, and --fix keeps the lines."""
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(
        "! python prep.py --data_dir data/train \\\n                 --max_len 510 \\\n"
        "                 --output_dir data\n\nprint('done')"))
    nb.cells.append(nbformat.v4.new_code_cell((FIXTURES / "fsdp2_lora_after_shard_buggy.py").read_text()))
    path = tmp_path / "prep.ipynb"
    nbformat.write(nb, str(path))
    found = findings(str(path))
    assert "FSDP900" not in {f["code"] for f in found}
    assert "FSDP101" in {f["code"] for f in found}
    before = json.loads(path.read_text())["cells"][0]["source"]
    run(str(path), "--fix")
    assert json.loads(path.read_text())["cells"][0]["source"] == before
