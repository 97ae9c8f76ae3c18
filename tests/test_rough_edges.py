"""Rough edges a new user meets first: advice failing a commit, a hub lookup that hangs, a missing extra."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

ROOT = Path(__file__).resolve().parent.parent
# Advice only (FSDP015, info): the root's reshard_after_forward=True is redundant.
ADVICE = textwrap.dedent(
    """\
    from torch.distributed.fsdp import fully_shard
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model, reshard_after_forward=True)
    """
)
BUG = textwrap.dedent(
    """\
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    def main(model, policy):
        model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
        return get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
    """
)


def lint(path, *args):
    return CliRunner().invoke(main, ["--isolated", "--no-cache", "--target-version", "torch=2.8", str(path), *args])


def test_info_findings_are_reported_but_do_not_fail_by_default(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(ADVICE)
    r = lint(script)
    assert "FSDP015" in r.output and "[info]" in r.output
    assert r.exit_code == 0
    assert lint(script, "--fail-level", "info").exit_code == 1
    assert lint(script, "--fail-level", "error").exit_code == 0


def test_errors_fail_at_every_level_but_the_level_decides_for_warnings(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(BUG)
    for level in ("error", "warning", "info"):
        assert lint(script, "--fail-level", level).exit_code == 1


def test_an_unreachable_hub_fails_fast_with_what_to_do(tmp_path):
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_CACHE": str(tmp_path / "hub")}
    env.pop("HF_HUB_OFFLINE", None)
    cmd = [sys.executable, "-m", "fsdplint", "model", "some-org/some-model", "--lora"]

    def timed(environ):
        start = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, env=environ, cwd=ROOT, timeout=120)
        return p, time.monotonic() - start

    p, took = timed(env)
    assert p.returncode == 2
    # (bitsandbytes may print its own kernel notice on import; fsdplint says one thing.)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("fsdplint:")]
    assert len(lines) == 1 and "Traceback" not in p.stderr and "Retrying" not in p.stderr, p.stderr
    assert "HF_HUB_OFFLINE=1" in lines[0] and "local model directory" in lines[0] and "some-org/some-model" in lines[0]
    # As fast as the same lookup offline (which never touches the network), give or take the probe's
    # few seconds: not the retry loop's most of a minute. Compared, so a loaded machine's imports cancel out.
    offline, base = timed({**env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 2
    assert took < base + 10, f"{took:.1f} s online vs {base:.1f} s offline before the user heard anything"


# Runs fsdplint as the console script would, with `import torch` failing as on a machine without it.
NO_TORCH = textwrap.dedent(
    """\
    import sys
    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "torch":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, NoTorch())
    from fsdplint.__main__ import main
    sys.argv = ["fsdplint", *sys.argv[1:]]
    main()
    """
)


def without_torch(*args, cwd):
    return subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True, cwd=cwd, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("args", [("model", "config.json", "--lora"), ("check", "train.py", "--model", "config.json")])
def test_a_missing_model_extra_is_one_line_with_the_pip_command(tmp_path, args):
    (tmp_path / "train.py").write_text(BUG)
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    p = without_torch(*args, cwd=tmp_path)
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "pip install 'fsdplint[model]'" in lines[0] and "torch" in lines[0]
    assert "FSDP901" not in p.stdout and "internal error" not in p.stdout + p.stderr


def test_the_static_linter_needs_no_torch(tmp_path):
    (tmp_path / "train.py").write_text(BUG)
    p = without_torch("--isolated", "--no-cache", "train.py", cwd=tmp_path)
    assert p.returncode == 1 and "FSDP101" in p.stdout, p.stderr
