"""A plain (non-editable) install from a built wheel ships every rule and works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_in_fresh_venv_ships_every_rule(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        check=True, capture_output=True, text=True,
    )
    (wheel,) = dist.glob("fsdplint-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    expected = sorted(p.name for p in (ROOT / "rules").glob("fsdp*.py"))
    shipped = sorted(Path(n).name for n in names if n.startswith("fsdplint/rules/fsdp"))
    assert shipped == expected

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    # The fresh venv must see only what the wheel installs: a PYTHONPATH pointing at the checkout (whose
    # `pip wheel` left fsdplint's metadata there) would make pip think fsdplint is already installed.
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True, text=True, env=clean)
    exe = env_dir / "bin" / "fsdplint"
    rules = json.loads(subprocess.run([str(exe), "rules", "--output-format", "json"], capture_output=True, text=True, check=True, cwd=tmp_path, env=clean).stdout)
    assert sorted(r["code"] for r in rules) == sorted(p.name[:7].upper() for p in (ROOT / "rules").glob("fsdp*.py"))

    script = tmp_path / "train.py"
    script.write_text(
        "import torch.distributed.fsdp as f\nfrom peft import get_peft_model\n"
        "for layer in model.layers:\n    f.fully_shard(layer)\nf.fully_shard(model)\nmodel = get_peft_model(model, cfg)\n"
    )
    p = subprocess.run([str(exe), "--isolated", str(script)], capture_output=True, text=True, cwd=tmp_path, env=clean)
    assert p.returncode == 1 and "FSDP101" in p.stdout, p.stdout + p.stderr
