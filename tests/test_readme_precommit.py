"""The README's pre-commit snippet, pasted into a project as a user would, run by the real pre-commit."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("pre_commit")
nbformat = pytest.importorskip("nbformat")
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="pre-commit needs git")

BUGGY = """\
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

def main(model, policy):
    model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
    return get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
"""
# Only advice (FSDP015, info) on torch 2.8.
ADVICE = """\
from torch.distributed.fsdp import fully_shard
for layer in model.model.layers:
    fully_shard(layer)
fully_shard(model, reshard_after_forward=True)
"""


def readme_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"```yaml\n(# \.pre-commit-config\.yaml.*?)```", text, re.S)
    assert m, "the README shows a .pre-commit-config.yaml"
    return m.group(1)


def test_the_readme_snippet_names_no_tag_the_repository_lacks():
    snippet = readme_snippet()
    tags = subprocess.run(["git", "tag"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    for rev in re.findall(r"rev:\s*(\S+)", snippet):
        assert rev in tags or re.fullmatch(r"[0-9a-f]{40}", rev), rev


def test_the_readme_snippet_runs_and_blocks_bugs_not_advice(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".pre-commit-config.yaml").write_text(readme_snippet())
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "job"\ndependencies = ["torch>=2.8"]\n')
    (tmp_path / "advice.py").write_text(ADVICE)
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(BUGGY))
    nbformat.write(nb, str(tmp_path / "explore.ipynb"))
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PRE_COMMIT_HOME": str(tmp_path / ".pc-home"), "PYTHONPATH": str(ROOT)}

    def hook(*files):
        return subprocess.run([sys.executable, "-m", "pre_commit", "run", "--files", *files], cwd=tmp_path,
                              capture_output=True, text=True, env=env, timeout=300)

    ok = hook("advice.py")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = hook("explore.ipynb")
    assert bad.returncode == 1 and "explore.ipynb:cell 1:6:" in bad.stdout and "FSDP101" in bad.stdout, bad.stdout
