"""The static path never imports torch, peft, transformers or the user's code (startup must stay fast)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HEAVY = ("torch", "peft", "transformers", "accelerate", "bitsandbytes", "rich")


def test_lint_imports_no_heavy_library(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """\
            import torch
            from peft import get_peft_model
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, auto_wrap_policy=policy)
            model = get_peft_model(model, cfg)
            """
        )
    )
    probe = textwrap.dedent(
        f"""
        import sys
        from fsdplint.cli import main
        try:
            main(["--isolated", {str(script)!r}, "--output-format", "json"])
        except SystemExit as e:
            code = e.code
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        print("HEAVY:", heavy)
        print("CODE:", code)
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "CODE: 1" in out
    assert "HEAVY: []" in out, out


def test_linting_never_runs_the_script(tmp_path):
    marker = tmp_path / "ran"
    script = tmp_path / "evil.py"
    script.write_text(
        f"import pathlib, os\npathlib.Path({str(marker)!r}).write_text('x')\nos._exit(3)\n"
        "from peft import get_peft_model\nimport torch.distributed.fsdp as f\nfor layer in m.layers:\n    f.fully_shard(layer)\nm = f.fully_shard(m)\nm = get_peft_model(m, c)\n"
    )
    p = subprocess.run([sys.executable, "-m", "fsdplint", "--isolated", str(script)], capture_output=True, text=True)
    assert p.returncode == 1 and "FSDP101" in p.stdout
    assert not marker.exists()
