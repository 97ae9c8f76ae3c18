"""The findings cache: the same findings with and without it, and reuse only while nothing they were drawn
from changed (the linted file, the modules it imports, the configuration)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"

HELPERS_WRAP = """from torch.distributed.fsdp import fully_shard


def wrap(model):
    fully_shard(model)
    return model
"""
HELPERS_PLAIN = """def wrap(model):
    return model
"""
TRAIN = """from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from helpers import wrap

model = AutoModelForCausalLM.from_pretrained("m")
model = wrap(model)
model = get_peft_model(model, LoraConfig(r=8))
"""


def _write(path: Path, text: str) -> None:
    """Write and move the modification time on, as an editor saving the file a moment later would."""
    old = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, max(st.st_mtime_ns, old + 1_000_000_000)))


_ONE_RUN = """
import json, sys
from fsdplint import findings_cache
from fsdplint.engine import Settings, lint_files
files, cache_dir, use_cache = json.loads(sys.argv[1])
results = lint_files(files, Settings(cache_dir=cache_dir, use_cache=use_cache))
seen = [[(f.to_json(), repr(sorted(f.notes.items())), f.source_line) for f in r.findings] for r in results]
print(json.dumps({"seen": seen, "hits": findings_cache.STATS["hits"]}))
"""


def _run(files, cache_dir, use_cache=True):
    """One lint run in its own process, as the CLI and pre-commit run: the findings and the cache hits.
    (A long-lived process keeps reads memoised by earlier runs, so it reuses less: see findings_cache.)"""
    arg = json.dumps([[str(f) for f in files], str(cache_dir), use_cache])
    p = subprocess.run([sys.executable, "-c", _ONE_RUN, arg], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return [[tuple(x) for x in r] for r in out["seen"]], out["hits"]


def _codes(seen):
    return sorted(x[0]["code"] for x in seen)


def test_fixture_findings_identical_with_and_without_the_cache(tmp_path):
    proj = tmp_path / "proj"
    shutil.copytree(FIXTURES, proj, ignore=shutil.ignore_patterns("*.json"))
    (proj / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    files = sorted(proj.glob("*.py"))[:24]
    assert len(files) >= 20
    plain, _ = _run(files, tmp_path / "c", use_cache=False)
    cold, cold_hits = _run(files, tmp_path / "c")
    warm, warm_hits = _run(files, tmp_path / "c")
    assert cold_hits == 0 and warm_hits == len(files)
    assert any(plain), "the fixtures have findings"
    assert cold == plain and warm == plain


def _project(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "helpers.py").write_text(HELPERS_WRAP)
    (tmp_path / "other.py").write_text("def unrelated():\n    return 1\n")
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path / "train.py"


def test_a_changed_imported_module_invalidates_the_importer(tmp_path):
    train = _project(tmp_path)
    first, _ = _run([train], tmp_path / "c")
    assert "FSDP101" in _codes(first[0])
    _write(tmp_path / "helpers.py", HELPERS_PLAIN)  # the wrap is gone: so is the finding
    second, hits = _run([train], tmp_path / "c")
    assert hits == 0 and "FSDP101" not in _codes(second[0])
    _write(tmp_path / "helpers.py", HELPERS_WRAP)
    third, hits = _run([train], tmp_path / "c")
    assert third == first


def test_an_unrelated_module_leaves_the_findings_cached(tmp_path):
    train = _project(tmp_path)
    first, _ = _run([train], tmp_path / "c")
    _write(tmp_path / "other.py", "def unrelated():\n    return 2\n")
    second, hits = _run([train], tmp_path / "c")
    assert hits == 1 and second == first
    # A re-import through a package `__init__` still counts: a change below it invalidates.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .impl import wrap\n")
    (pkg / "impl.py").write_text(HELPERS_WRAP)
    _write(train, TRAIN.replace("from helpers import wrap", "from pkg import wrap"))
    third, _ = _run([train], tmp_path / "c")
    assert "FSDP101" in _codes(third[0])
    _write(pkg / "impl.py", HELPERS_PLAIN)
    fourth, hits = _run([train], tmp_path / "c")
    assert hits == 0 and "FSDP101" not in _codes(fourth[0])


def _cli(tmp_path, *args):
    """A new `fsdplint` process, as a user runs it twice (nothing memoised in between)."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-m", "fsdplint", "check", "train.py", "--output-format", "json",
                          "--exit-zero", "--cache-dir", str(tmp_path / "c"), *args],
                         cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    return sorted(f["code"] for f in json.loads(out.stdout))


def test_a_notebooks_findings_keep_their_cell_when_reused(tmp_path):
    # A notebook's finding is at a row of a cell: reused from the cache, it must name the same cell.
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# Fine-tune\n"]},
             {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": ["import torch\n"]},
             {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": ["from peft import LoraConfig\n", "config = LoraConfig(r=8 lora_alpha=16)\n"]}]
    (tmp_path / "tune.ipynb").write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                                     "nbformat_minor": 5}))
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}

    def run(*args):
        out = subprocess.run([sys.executable, "-m", "fsdplint", "check", "tune.ipynb", "--output-format", "json",
                              "--exit-zero", *args], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
        return out.stdout

    plain = run("--no-cache")
    assert [(f["code"], f.get("cell")) for f in json.loads(plain)] == [("FSDP900", 3)]
    cache = ("--cache-dir", str(tmp_path / "c"))
    assert run(*cache) == plain  # the run that fills the cache
    assert run(*cache) == plain  # every finding reused


def test_a_changed_configuration_invalidates(tmp_path):
    _project(tmp_path)
    assert "FSDP101" in _cli(tmp_path)
    _write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n\n[tool.fsdplint]\nignore = ['FSDP101']\n")
    assert "FSDP101" not in _cli(tmp_path)
    assert _cli(tmp_path) == _cli(tmp_path, "--no-cache")


QLORA = """from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

model = AutoModelForCausalLM.from_pretrained("m", quantization_config=BitsAndBytesConfig(load_in_4bit=True))
model = get_peft_model(model, LoraConfig(r=8))
"""


def test_a_changed_launcher_invalidates(tmp_path):
    # A script with no FSDP of its own: FSDP1 comes from the accelerate config its launcher names.
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "train.py").write_text(QLORA)
    (tmp_path / "fsdp.yaml").write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n")
    launcher = tmp_path / "run.sh"
    launcher.write_text("accelerate launch --config_file fsdp.yaml train.py\n")
    assert _cli(tmp_path) == ["FSDP202"] == _cli(tmp_path)
    _write(launcher, "python train.py\n")
    assert _cli(tmp_path) == [] == _cli(tmp_path, "--no-cache")
    _write(launcher, "accelerate launch --config_file fsdp.yaml train.py\n")
    assert _cli(tmp_path) == ["FSDP202"]
    _write(tmp_path / "fsdp.yaml", "distributed_type: NO\n")  # the config it names, changed
    assert _cli(tmp_path) == [] == _cli(tmp_path, "--no-cache")
