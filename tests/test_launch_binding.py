"""A launcher runs the script its command names, resolved from where it runs, never every same-named script."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main
from fsdplint.launch.shell import launches_for

TARGETS = [
    "--target-version", "torch=2.6", "--target-version", "accelerate=1.15.0", "--target-version", "peft=0.21.2",
    "--target-version", "transformers=5.24.0", "--target-version", "bitsandbytes=0.50.2",
]

# The launch decides: `--quant 4bit` loads a uint8-storage 4-bit model that FSDP1 then shards (FSDP202).
QLORA_BY_CHOICE = """\
import argparse
import functools
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

parser = argparse.ArgumentParser()
parser.add_argument("--quant", choices=["none", "4bit"], default="none")
args = parser.parse_args()
quantization_config = None
if args.quant == "4bit":
    quantization_config = BitsAndBytesConfig(load_in_4bit=True)
model = AutoModelForCausalLM.from_pretrained("m", quantization_config=quantization_config)
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
"""


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


def _examples(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    _write(root, {
        "pyproject.toml": "[project]\nname = 'demo'\n",
        "examples/plain/train.py": QLORA_BY_CHOICE,
        "examples/plain/run.sh": "python train.py --quant none\n",
        "examples/qlora/train.py": QLORA_BY_CHOICE,
        "examples/qlora/run.sh": "torchrun --nproc_per_node 8 train.py --quant 4bit\n",
        "examples/lora/train.py": QLORA_BY_CHOICE,
        "examples/lora/run.sh": 'cd "$(dirname "$0")"\naccelerate launch train.py\n',
    })
    return root


def test_each_example_folder_is_launched_by_its_own_run_sh_only(tmp_path):
    root = _examples(tmp_path)
    found = _lint(root)
    bad = [f for f in found if f["code"] == "FSDP202"]
    assert [Path(f["filename"]).parent.name for f in bad] == ["qlora"]
    assert bad[0]["severity"] == "error"
    assert "examples/qlora/run.sh" in bad[0]["message"].replace("\\", "/")
    # The two correct scripts get nothing at all, linted with the repository or alone.
    assert not [f for f in found if Path(f["filename"]).parent.name != "qlora"]
    assert _lint(root / "examples" / "plain" / "train.py") == []
    assert _lint(root / "examples" / "lora") == []


def test_launch_lines_bind_by_the_path_they_name(tmp_path):
    root = _examples(tmp_path)
    _write(root, {
        # From the repository root: the path names the folder.
        "scripts/all.sh": "python examples/lora/train.py --quant 4bit\n",
        # A `cd` earlier in the script moves where a relative name is looked up.
        "scripts/cd.sh": "cd ../examples/plain\npython train.py --quant 4bit\n",
        # A module run from the root.
        "scripts/mod.sh": "python -m examples.qlora.train\n",
        # An unknown directory before a name three folders share: no folder can be told, none is bound.
        "scripts/open.sh": "python $WORKDIR/train.py --quant 4bit\n",
    })
    by_script = {
        name: sorted(Path(l.file).name for l in launches_for(root / "examples" / name / "train.py"))
        for name in ("plain", "qlora", "lora")
    }
    assert by_script == {"plain": ["cd.sh", "run.sh"], "qlora": ["mod.sh", "run.sh"], "lora": ["all.sh", "run.sh"]}


def test_an_unknown_directory_before_a_name_only_one_script_has_binds_to_it(tmp_path):
    root = tmp_path / "repo"
    _write(root, {
        "pyproject.toml": "[project]\nname = 'demo'\n",
        "src/finetune.py": QLORA_BY_CHOICE,
        "jobs/slurm.sh": "srun python $CODE_DIR/finetune.py --quant 4bit\n",
        "jobs/other.sh": "python $CODE_DIR/elsewhere/finetune.py\n",
    })
    assert [Path(l.file).name for l in launches_for(root / "src" / "finetune.py")] == ["slurm.sh"]


def test_a_module_in_a_src_layout_binds_from_the_root(tmp_path):
    root = tmp_path / "repo"
    _write(root, {
        "pyproject.toml": "[project]\nname = 'demo'\n",
        "src/pkg/train.py": QLORA_BY_CHOICE,
        "src/pkg/eval/train.py": QLORA_BY_CHOICE,
        "run.sh": "accelerate launch -m pkg.train --quant 4bit\n",
    })
    assert [Path(l.file).name for l in launches_for(root / "src" / "pkg" / "train.py")] == ["run.sh"]
    assert launches_for(root / "src" / "pkg" / "eval" / "train.py") == []


def test_a_shell_launcher_on_the_command_line_lints_the_scripts_it_runs_under_it(tmp_path, monkeypatch):
    root = _examples(tmp_path)
    monkeypatch.chdir(root)
    found = _lint("examples/qlora/run.sh")
    assert [(f["code"], f["filename"]) for f in found] == [("FSDP202", "examples/qlora/train.py")]
    assert "examples/qlora/run.sh:1" in found[0]["message"]
    # The launcher is never parsed as Python (FSDP900 SyntaxError), and a correct launch reports nothing.
    assert _lint("examples/plain/run.sh") == []


def test_a_shell_launcher_whose_script_is_missing_says_so(tmp_path, monkeypatch):
    _write(tmp_path, {"job.sh": "deepspeed train.py\npython missing.py --quant 4bit\n"})
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["check", "--isolated", "job.sh"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "job.sh:2: the script it launches (missing.py) was not found" in r.stderr
    assert "FSDP900" not in r.output
