"""A tree with no project marker (no pyproject.toml/.git): the directory the user lints is the project, so a
launcher at its top reaches a script two directories down, with the recipe it names.

Everything goes through the real CLI, on files written to a temporary folder.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main

TARGETS = ["--target-version", "torch=2.6", "--target-version", "transformers=5.24.0",
           "--target-version", "peft=0.21.2", "--target-version", "accelerate=1.15.0"]

SCRIPT = """\
from dataclasses import dataclass, field

from peft import AutoPeftModelForCausalLM
from transformers import AutoModelForCausalLM, TrainingArguments
from trl import SFTTrainer, TrlParser


@dataclass
class Extra:
    model_id: str = field(default=None)
    merge: bool = field(default=False)


def run(extra, targs):
    model = AutoModelForCausalLM.from_pretrained(extra.model_id)
    trainer = SFTTrainer(model=model, args=targs, train_dataset=ds)
    trainer.train()
    trainer.save_model()
    if extra.merge and targs.distributed_state.is_main_process:
        model = AutoPeftModelForCausalLM.from_pretrained(targs.output_dir)
        model = model.merge_and_unload()
        model.save_pretrained("/out/merged")
    targs.distributed_state.wait_for_everyone()


if __name__ == "__main__":
    extra, targs = TrlParser((Extra, TrainingArguments)).parse_args_and_config()
    run(extra, targs)
"""

RECIPE = """\
model_id: org/big-model
output_dir: /tmp/run
merge: true
fsdp: "full_shard auto_wrap"
"""


def _tree(tmp_path: Path, recipe: str) -> Path:
    root = tmp_path / "job"
    (root / "src" / "train").mkdir(parents=True)
    (root / "src" / "train" / "sft.py").write_text(SCRIPT)
    (root / "conf").mkdir()
    (root / "conf" / "run.yaml").write_text(recipe)
    (root / "go.sh").write_text(textwrap.dedent("""\
        #!/bin/bash
        ACCELERATE_USE_FSDP=1 torchrun --nproc_per_node 8 \\
            src/train/sft.py --config conf/run.yaml
        """))
    return root


def _lint(where: Path, monkeypatch, cwd: Path) -> list[dict]:
    monkeypatch.chdir(cwd)
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--no-cache", "--output-format", "json",
                                  *TARGETS, str(where)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_launcher_at_the_linted_root_reaches_the_script_and_its_recipe(tmp_path, monkeypatch):
    root = _tree(tmp_path, RECIPE)
    found = _lint(Path("."), monkeypatch, root)
    (f,) = [f for f in found if f["code"] == "FSDP403"]
    assert f["location"]["row"] == 20 and "go.sh:2" in f["message"]
    # The merged model is a fresh, unsharded load: its rank-0 save_pretrained gathers nothing.
    assert [f for f in found if f["code"] == "FSDP401"] == []


def test_recipe_that_raises_ddp_timeout_silences_the_warning(tmp_path, monkeypatch):
    root = _tree(tmp_path, RECIPE + "ddp_timeout: 10800\n")
    assert [f for f in _lint(Path("."), monkeypatch, root) if f["code"] == "FSDP403"] == []


def test_linting_only_the_script_folder_does_not_look_above_it(tmp_path, monkeypatch):
    root = _tree(tmp_path, RECIPE)
    # The recipe is what switches `merge` on; without the launcher the default (False) rules the branch out.
    found = _lint(Path("src/train"), monkeypatch, root)
    assert [f for f in found if f["code"] == "FSDP403"] == []
