"""Launch commands documented in README/docs (fenced shell blocks, `$ ` console lines, RST code blocks)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main
from fsdplint.launch.shell import launches_for
from test_launch_binding import QLORA_BY_CHOICE, TARGETS


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


def _lint(*args) -> list[dict]:
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--output-format", "json", *TARGETS,
                                  *map(str, args)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


README = """\
# Fine-tuning

Install, then run from the repository root:

```bash
pip install -e .
torchrun --nproc_per_node 8 \\
    scripts/train.py --quant 4bit
```

```python
# not a launch: python scripts/train.py --quant none
```
"""


def test_a_readme_fenced_block_is_a_launch_pointing_into_the_readme(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    _write(root, {"pyproject.toml": "[project]\nname = 'demo'\n", "scripts/train.py": QLORA_BY_CHOICE,
                  "README.md": README})
    monkeypatch.chdir(root)
    (launch,) = launches_for(Path("scripts/train.py"))
    assert (launch.file, launch.line, launch.launcher) == ("README.md", 7, "torchrun")
    (f,) = _lint("scripts/train.py")
    assert f["code"] == "FSDP202" and f["severity"] == "error"
    assert "when launched by README.md:7" in f["message"]


def test_console_lines_and_rst_code_blocks_in_docs_and_examples(tmp_path):
    root = tmp_path / "repo"
    _write(root, {
        "pyproject.toml": "[project]\nname = 'demo'\n",
        "examples/qlora/train.py": QLORA_BY_CHOICE,
        # A console session: `$ ` lines are commands, the rest is output.
        "examples/qlora/README.md": "Run it:\n\n```console\n$ cd examples/qlora\n$ python train.py --quant 4bit\n"
                                    "python train.py: loading\n```\n",
        "docs/usage.rst": "Usage\n=====\n\n.. code-block:: bash\n\n   accelerate launch -m examples.qlora.train \\\n"
                          "      --quant none\n",
        # An untagged block that holds no launcher command, and a page outside docs/: not read.
        "docs/notes.md": "```\nquant = 4bit\n```\n",
        "notes/howto.md": "```bash\npython examples/qlora/train.py --quant 4bit\n```\n",
    })
    got = sorted((Path(l.file).name, l.line, l.launcher) for l in launches_for(root / "examples/qlora/train.py"))
    assert got == [("README.md", 5, "python"), ("usage.rst", 6, "accelerate")]


DEFAULT_FSDP1 = "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"


def test_a_bare_accelerate_launch_reads_the_users_default_config(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    script = QLORA_BY_CHOICE.replace("model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)",
                                     "from accelerate import Accelerator\nmodel = Accelerator().prepare(model)")
    script = script.replace("default=\"none\"", "default=\"4bit\"")
    _write(root, {"pyproject.toml": "[project]\nname = 'demo'\n", "train.py": script,
                  "run.sh": "accelerate launch train.py\n"})
    home = tmp_path / "hf"
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    assert _lint(root / "train.py") == []  # no default config: accelerate runs without FSDP
    (home / "accelerate").mkdir(parents=True)
    (home / "accelerate" / "default_config.yaml").write_text(DEFAULT_FSDP1)
    (f,) = _lint(root / "train.py")
    assert f["code"] == "FSDP202"
    # XDG_CACHE_HOME is where accelerate looks when HF_HOME is not set.
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _lint(root / "train.py") == []
    (tmp_path / "xdg" / "huggingface" / "accelerate").mkdir(parents=True)
    (tmp_path / "xdg" / "huggingface" / "accelerate" / "default_config.yaml").write_text(DEFAULT_FSDP1)
    assert [f["code"] for f in _lint(root / "train.py")] == ["FSDP202"]
    # `--cpu` does not read it.
    (root / "run.sh").write_text("accelerate launch --cpu train.py\n")
    assert _lint(root / "train.py") == []


TRAINER_FSDP_JSON = """\
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("m", quantization_config=BitsAndBytesConfig(load_in_4bit=True))
FSDP_JSON = "configs/fsdp.json"
args = TrainingArguments(output_dir="o", fsdp="full_shard auto_wrap", fsdp_config=FSDP_JSON)
Trainer(model=model, args=args).train()
"""


# FSDP1 keeps the uint8 storage FSDP1 cannot flatten (FSDP202); FSDP2 on torch 2.6 cannot exclude 4-bit weights (FSDP201).
@pytest.mark.parametrize("version,expected", [(1, ["FSDP202"]), (2, ["FSDP201"])])
def test_the_trainers_fsdp_config_json_file_is_read(tmp_path, monkeypatch, version, expected):
    _write(tmp_path, {"train.py": TRAINER_FSDP_JSON,
                      "configs/fsdp.json": f'{{\n  "version": {version},\n  "backward_prefetch": "backward_pre"\n}}\n'})
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    assert [f["code"] for f in _lint("train.py")] == expected
