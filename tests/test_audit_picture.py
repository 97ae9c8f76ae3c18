"""`fsdplint model --plot` and `--world-size 2,4,8`: per-rank memory by component, as a PNG and an
80-column table, and the first world size that fits --gpu-memory."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from fsdplint.audit.cli import model_command  # noqa: E402

# A small llama the test writes (2 layers, hidden 512): fast on meta, big enough to show the components.
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512, "intermediate_size": 1376,
        "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 2, "vocab_size": 32000,
        "max_position_embeddings": 2048, "torch_dtype": "bfloat16"}


def audit(tmp_path, *args):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    return CliRunner().invoke(model_command, [str(cfg), "--fsdp", "2", "--seq-len", "512", *args])


def table(output: str) -> list[list[str]]:
    lines = output.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Per-rank GPU memory"))
    rows = []
    for ln in lines[start + 2:]:
        if not re.match(r"\s*\d+\s", ln):
            break
        rows.append(ln.split())
    return rows


def test_capacity_plan_table_fits_80_columns_and_names_the_first_fit(tmp_path):
    r = audit(tmp_path, "--world-size", "1,2,4,8", "--gpu-memory", "350MiB")
    assert r.exit_code in (0, 1), r.output
    assert "fsdplint: building" not in r.output  # not a terminal: no status line
    rows = table(r.output)
    assert [int(x[0]) for x in rows] == [1, 2, 4, 8]
    totals = [float(x[7]) for x in rows]
    assert totals == sorted(totals, reverse=True) and totals[0] > totals[-1]  # more ranks, less per rank
    plan = r.output[r.output.index("Per-rank GPU memory"):]
    assert max(len(ln) for ln in plan.splitlines()) <= 80
    # 350 MiB: too small for 1 rank of this model, enough once it is sharded over 8.
    fits = [int(x[0]) for x in rows if x[-1] == "fits"]
    assert rows[0][-1] == "OVER" and rows[-1][-1] == "fits"
    assert f"Fits from {fits[0]} ranks." in r.output
    assert all(x[-1] == "OVER" for x in rows if int(x[0]) < fits[0])


def test_plot_is_a_png_with_one_bar_per_world_size(tmp_path):
    import matplotlib.image

    png = tmp_path / "memory.png"
    r = audit(tmp_path, "--world-size", "2,4", "--gpu-memory", "80GiB", "--plot", str(png))
    assert r.exit_code in (0, 1), r.output
    assert f"Memory plot written to {png}" in r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(str(png))
    assert img.shape[1] >= 800 and img.shape[0] >= 300  # big enough to read


def test_components_add_up_to_the_reported_total(tmp_path):
    from fsdplint.audit.picture import breakdown
    from fsdplint.audit.runner import run_audit
    from fsdplint.audit.spec import load_spec

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    spec = load_spec(str(cfg), {"fsdp": "2", "world_size": 4, "seq_len": 512, "lora": "default"})
    mem = run_audit(spec).memory
    parts = breakdown(mem)
    assert sum(parts.values()) == mem.total
    assert parts["params"] > 0 and parts["activations"] > 0 and parts["grads"] > 0


def test_a_bad_world_size_list_is_one_line(tmp_path):
    r = audit(tmp_path, "--world-size", "8,x")
    assert r.exit_code == 2 and "--world-size" in r.output and "Traceback" not in r.output


def test_cpu_offload_moves_the_sharded_state_off_the_gpu(tmp_path):
    """--offload (and fsdp_offload_params: true) keeps parameters, gradients and AdamW state on the host."""
    from fsdplint.audit.memory import estimate
    from fsdplint.audit.picture import breakdown
    from fsdplint.audit.runner import run_audit
    from fsdplint.audit.spec import load_spec

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    spec = load_spec(str(cfg), {"fsdp": "2", "world_size": 2, "seq_len": 512, "lora": "default", "offload": True})
    assert spec.fsdp.offload_params
    result = run_audit(spec)
    on, off = result.memory, estimate(result.plan, activations=result.memory.activations)
    a, b = breakdown(on), breakdown(off)
    assert a["params"] == 0 and b["params"] > 0 and a["optimizer"] == 0 < b["optimizer"]
    assert on.total < off.total
    assert (a["gathered unit"], a["activations"]) == (b["gathered unit"], b["activations"])
    # What moved is still shown, as host memory.
    host = [ln for ln in on.lines if not ln.on_device]
    assert any("CPU offload" in ln.label for ln in host)


def test_status_line_only_on_a_terminal(tmp_path):
    """While the model builds, stderr says what is going on, only when it is a terminal."""
    import os
    import pty
    import subprocess
    import sys

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "fsdplint", "model", str(cfg), "--fsdp", "2"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=slave, env=env, cwd=root)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    p.wait(timeout=300)
    os.close(master)
    assert b"fsdplint: building" in seen and b"meta device" in seen
