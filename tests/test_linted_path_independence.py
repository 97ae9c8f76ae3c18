"""A file's findings do not depend on which directory or file was named on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

ROOT = Path(__file__).resolve().parent.parent
AXOLOTL = (ROOT / "fixtures" / "toolconfigs" / "axolotl_project" / "finetune.yml").read_text()
FSDP1 = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\nnum_processes: 4\n"
LOADS_8BIT = (
    "from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n"
    "model = AutoModelForCausalLM.from_pretrained('m', quantization_config=BitsAndBytesConfig(load_in_8bit=True))\n"
)


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    # The tool YAML itself says nothing of FSDP: the launcher's accelerate config (elsewhere) does.
    files = {
        "configs/fsdp1.yaml": FSDP1,
        "examples/axolotl/lora8.yml": AXOLOTL[:AXOLOTL.index("fsdp:")],
        "examples/plain/train.py": LOADS_8BIT,
        "scripts/axolotl.sh": "accelerate launch --config_file configs/fsdp1.yaml -m axolotl.cli.train "
                              "examples/axolotl/lora8.yml\n",
        "scripts/plain.sh": "accelerate launch --config_file configs/fsdp1.yaml examples/plain/train.py\n",
    }
    (root / ".git").mkdir(parents=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _found(named: str) -> list[tuple]:
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--output-format", "json", named],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return sorted((f["filename"], f["code"], f["severity"], f["location"]["row"]) for f in json.loads(r.stdout))


@pytest.mark.parametrize("target,named", [
    ("examples/axolotl/lora8.yml", [".", "examples", "examples/axolotl", "examples/axolotl/lora8.yml"]),
    ("examples/plain/train.py", [".", "examples", "examples/plain", "examples/plain/train.py"]),
])
def test_same_findings_whichever_folder_is_linted(tmp_path, monkeypatch, target, named):
    monkeypatch.chdir(_repo(tmp_path))
    answers = {n: [f for f in _found(n) if f[0] == target] for n in named}
    assert answers[target] and answers[target][0][1] == "FSDP203" and answers[target][0][2] == "error"
    assert all(a == answers[target] for a in answers.values()), answers
