"""The pre-commit hooks, run by the real `pre-commit try-repo` against a temporary project.

pre-commit installs fsdplint from a snapshot of this checkout into its own
virtualenv (so the package must install with only the package index at hand).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fsdplint.findings import Applicability
from fsdplint.registry import all_rules

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("pre_commit")
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="pre-commit needs git")

BUGGY = '''\
import torch
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("org/model", torch_dtype=torch.bfloat16)
model = FSDP(model, use_orig_params=True)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
'''

CLEAN = '''\
import os

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")

model = AutoModelForCausalLM.from_pretrained("org/model", torch_dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
model.to(torch.bfloat16)  # one dtype per FSDP2 unit
for layer in model.base_model.model.model.layers:
    fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
'''

GIT_ENV = {
    "GIT_AUTHOR_NAME": "fsdplint tests",
    "GIT_AUTHOR_EMAIL": "tests@example.invalid",
    "GIT_COMMITTER_NAME": "fsdplint tests",
    "GIT_COMMITTER_EMAIL": "tests@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env={**os.environ, **GIT_ENV})


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory) -> Path:
    """A committed snapshot of this checkout (tracked and untracked, not ignored, files)."""
    all_rules()  # load the rules first, so every rule the tests pick is in the snapshot
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True,
    )
    if listing.returncode != 0:
        pytest.skip("not a git checkout of fsdplint")
    dest = tmp_path_factory.mktemp("hook-repo")
    for rel in filter(None, listing.stdout.decode().split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "--no-verify", "-m", "snapshot")
    return dest


@pytest.fixture(scope="module")
def pre_commit_home(tmp_path_factory) -> Path:
    # Shared by the tests of this module so the hook environment is built once.
    return tmp_path_factory.mktemp("pre-commit-home")


@pytest.fixture
def project(tmp_path) -> Path:
    git(tmp_path, "init", "-q")
    return tmp_path


def try_repo(hook_repo, home, project, hook, *files):
    env = {**os.environ, **GIT_ENV, "PRE_COMMIT_HOME": str(home), "PRE_COMMIT_COLOR": "never"}
    env.pop("VIRTUAL_ENV", None)
    cmd = [sys.executable, "-m", "pre_commit", "try-repo", str(hook_repo), hook, "--verbose", "--files", *files]
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=600)


def add(project, name, text):
    (project / name).write_text(text, encoding="utf-8")
    git(project, "add", name)


def test_lint_hook_fails_on_buggy_and_passes_on_clean(hook_repo, pre_commit_home, project):
    # The hook's environment has no torch: the project states the version it targets.
    add(project, "pyproject.toml", '[tool.fsdplint]\ntarget-version = { torch = "2.6" }\n')
    add(project, "buggy.py", BUGGY)
    add(project, "clean.py", CLEAN)
    bad = try_repo(hook_repo, pre_commit_home, project, "fsdplint", "buggy.py")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "buggy.py:8:" in bad.stdout and "FSDP101" in bad.stdout, bad.stdout
    good = try_repo(hook_repo, pre_commit_home, project, "fsdplint", "clean.py")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "Passed" in good.stdout


def test_hook_without_torch_passes_a_correct_fsdp2_script_that_declares_no_version(hook_repo, pre_commit_home, project):
    # No torch in the hook's environment and no version declared: the script's own public FSDP2 import
    # proves torch >= 2.6, so no FSDP008 from a guessed torch 2.4 (the CLI with torch installed agrees).
    add(project, "clean.py", CLEAN)
    good = try_repo(hook_repo, pre_commit_home, project, "fsdplint", "clean.py")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "FSDP008" not in good.stdout and "Passed" in good.stdout


def _fix_example():
    """A static rule with a fix and a documented result; safe fixes preferred."""
    candidates = [
        (rule, ex)
        for rule in all_rules()
        if rule.fix is not None and rule.has_static_check()
        for ex in rule.INVALID
        if ex.expected_fix is not None and not ex.target and not ex.options
    ]
    candidates.sort(key=lambda c: c[0].fix != Applicability.SAFE)
    return candidates[0] if candidates else (None, None)


def _run_with_config(hook_repo, home, project, hook, args, *files):
    """`pre-commit run` with the hook's args overridden in a .pre-commit-config.yaml."""
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=hook_repo, capture_output=True, text=True, check=True).stdout.strip()
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {json.dumps(str(hook_repo))}\n    rev: {rev}\n    hooks:\n"
        f"      - id: {hook}\n        args: {json.dumps(args)}\n"
    )
    git(project, "add", ".pre-commit-config.yaml")
    env = {**os.environ, **GIT_ENV, "PRE_COMMIT_HOME": str(home), "PRE_COMMIT_COLOR": "never"}
    env.pop("VIRTUAL_ENV", None)
    cmd = [sys.executable, "-m", "pre_commit", "run", hook, "--verbose", "--files", *files]
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=600)


def test_fix_hook_rewrites_the_file(hook_repo, pre_commit_home, project):
    rule, example = _fix_example()
    if rule is None:
        pytest.skip("no rule with a fix and an expected_fix example is registered yet")
    add(project, "fixme.py", example.source())
    if rule.fix == Applicability.SAFE:
        res = try_repo(hook_repo, pre_commit_home, project, "fsdplint-fix", "fixme.py")
    else:
        # The hook applies safe fixes only; a project opts into unsafe ones through args.
        res = _run_with_config(hook_repo, pre_commit_home, project, "fsdplint-fix", ["--fix", "--unsafe-fixes"], "fixme.py")
    # pre-commit fails a hook that modified files.
    assert res.returncode == 1, res.stdout + res.stderr
    assert "files were modified by this hook" in res.stdout, res.stdout
    fixed = (project / "fixme.py").read_text(encoding="utf-8")
    assert fixed != example.source()
    after = subprocess.run(
        [sys.executable, "-m", "fsdplint", "check", "--isolated", "--output-format", "json", "fixme.py"],
        cwd=project, capture_output=True, text=True,
    )
    remaining = {f["code"] for f in json.loads(after.stdout)}
    assert rule.code not in remaining, fixed
    if not remaining:
        # Only this rule's fix applied: the result is the rule's documented fix.
        assert fixed == example.fixed_source()
