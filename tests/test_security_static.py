"""The static side never runs linted code: not at import, not by exit or fork, not via module shadowing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from click.testing import CliRunner

from fsdplint.cli import main

HOSTILE = """\
import os, sys, pathlib
pathlib.Path({marker!r}).write_text(str(os.getpid()))
if hasattr(os, "fork") and os.fork() == 0:
    os._exit(0)
sys.exit(7)
from peft import get_peft_model
import torch.distributed.fsdp as f
m = f.fully_shard(m)
m = get_peft_model(m, c)
"""


def test_exit_and_fork_at_import_do_nothing_in_process(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE.format(marker=str(marker)))
    pid = os.getpid()
    r = CliRunner().invoke(main, ["--isolated", str(script)])
    assert r.exit_code == 1 and "FSDP101" in r.output, r.output
    r = CliRunner().invoke(main, ["--isolated", str(script), "--fix", "--unsafe-fixes"])
    assert r.exit_code == 0 and "Fixed 1" in r.output, r.output
    assert os.getpid() == pid  # no forked child got here
    assert not marker.exists()


def test_modules_next_to_the_linted_code_are_never_imported(tmp_path):
    """A project with files named like what the linter imports lazily (yaml, difflib, tomllib, peft...)."""
    markers = tmp_path / "markers"
    markers.mkdir()
    names = ("yaml", "difflib", "tomllib", "json", "peft", "torch", "libcst", "rich", "click", "tempfile", "fsdplint_rules")
    for n in names:
        (tmp_path / f"{n}.py").write_text(f"import pathlib\npathlib.Path({str(markers / n)!r}).write_text('x')\n")
    (tmp_path / "train.py").write_text(HOSTILE.format(marker=str(markers / "train")))
    (tmp_path / "accel.yaml").write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n")
    exe = shutil.which("fsdplint", path=os.path.dirname(sys.executable)) or shutil.which("fsdplint")
    assert exe
    for args in (["."], [".", "--diff", "--unsafe-fixes"], [".", "--output-format", "sarif"],
                 ["train.py", "--accelerate-config", "accel.yaml"]):
        p = subprocess.run([exe, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert p.returncode in (0, 1), p.stderr
        assert sorted(os.listdir(markers)) == [], (args, p.stderr)
