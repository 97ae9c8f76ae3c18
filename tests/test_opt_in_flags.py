"""Opt-in flags: code behind an option the script defines to be passed (`store_true`, a bool dataclass
field defaulting to False, `type=str` defaulting to "False") is linted too, as a warning at most that
names the flags it needs; options of another domain keep their defaults, and errors stay decided by the
defaults and the launches.

Everything goes through the real CLI, on scripts written to a temporary project.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main

TARGETS = ["--target-version", "torch=2.6", "--target-version", "transformers=5.24.0",
           "--target-version", "peft=0.21.2", "--target-version", "bitsandbytes=0.50.2",
           "--target-version", "accelerate=1.15.0"]

TWO_FLAGS = """\
import argparse
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoModelForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--use_fsdp", action="store_true")
parser.add_argument("--lr", type=float, default=1e-4)
args = parser.parse_args()
model = AutoModelForCausalLM.from_pretrained("m")
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
if args.use_fsdp:
    model = FSDP(model)
"""

DATACLASS_FLAG = """\
import torch
from dataclasses import dataclass, field
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoModelForCausalLM, HfArgumentParser


@dataclass
class Options:
    use_fsdp: bool = field(default=False)


(opts,) = HfArgumentParser(Options).parse_args_into_dataclasses()
model = AutoModelForCausalLM.from_pretrained("m")
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
if opts.use_fsdp:
    model = FSDP(model)
if {other}:
    model.to("cuda")
"""

QLORA_UNDER_FLAGS = """\
import argparse
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

parser = argparse.ArgumentParser()
parser.add_argument("--use_fsdp", action="store_true")
parser.add_argument("--load_in_4bit", action="store_true")
args = parser.parse_args()
quantization_config = None
if args.load_in_4bit:
    quantization_config = BitsAndBytesConfig(load_in_4bit=True)
model = AutoModelForCausalLM.from_pretrained("m", quantization_config=quantization_config)
if args.use_fsdp:
    model = FSDP(model, use_orig_params=True)
"""


def _run(args, fmt="json"):
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--output-format", fmt, *TARGETS, *args],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout) if fmt in ("json", "sarif") else r.stdout


def _project(tmp_path, script: str, shells: dict[str, str] | None = None) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (root / "train.py").write_text(textwrap.dedent(script))
    for rel, text in (shells or {}).items():
        (root / rel).write_text(textwrap.dedent(text))
    return root / "train.py"


def _codes(found, code):
    return [f for f in found if f["code"] == code]


def test_store_true_flag_opens_its_branch_as_a_warning_naming_the_flag(tmp_path):
    script = _project(tmp_path, TWO_FLAGS)
    (f,) = _codes(_run([str(script)]), "FSDP102")
    assert f["severity"] == "warning" and f["location"]["row"] == 11
    assert f["message"].endswith("(when launched with `--use_fsdp`)")
    assert f["fix"] is None


def test_a_launch_that_passes_the_flag_decides_as_before(tmp_path):
    script = _project(tmp_path, TWO_FLAGS)
    (f,) = _codes(_run(["--launch", "torchrun --nproc_per_node 2 train.py --use_fsdp", str(script)]), "FSDP102")
    assert f["severity"] == "error" and "with `" not in f["message"]


def test_a_number_option_keeps_its_default(tmp_path):
    # `--lr` is not a switch: a branch its default rules out stays out.
    src = TWO_FLAGS.replace("if args.use_fsdp:", "if args.lr > 1.0:")
    script = _project(tmp_path, src)
    assert _codes(_run([str(script)]), "FSDP102") == []


def test_str_option_defaulting_to_false_text_is_a_switch(tmp_path):
    src = TWO_FLAGS.replace('add_argument("--use_fsdp", action="store_true")',
                            'add_argument("--use_fsdp", type=str, default="False")').replace(
        "if args.use_fsdp:", 'use_fsdp = args.use_fsdp == "True"\nif use_fsdp:')
    script = _project(tmp_path, src)
    (f,) = _codes(_run([str(script)]), "FSDP102")
    assert f["severity"] == "warning" and f["message"].endswith("(when launched with `--use_fsdp`)")


def test_dataclass_bool_field_is_a_switch(tmp_path):
    script = _project(tmp_path, DATACLASS_FLAG.format(other="True"))
    found = _run([str(script)])
    (f,) = _codes(found, "FSDP102")
    assert f["severity"] == "warning" and f["message"].endswith("(when launched with `--use_fsdp`)")
    # The `.to()` after the wrap runs in the same configuration: reported too.
    (to,) = _codes(found, "FSDP007")
    assert to["message"].endswith("(when launched with `--use_fsdp`)")


def test_places_the_flag_shuts_against_each_other_give_no_finding(tmp_path):
    # `.to()` runs only without `--use_fsdp`, the wrap only with it: no run moves the wrapped model.
    script = _project(tmp_path, DATACLASS_FLAG.format(other="not opts.use_fsdp"))
    found = _run([str(script)])
    assert _codes(found, "FSDP007") == []
    assert len(_codes(found, "FSDP102")) == 1


def test_body_and_else_of_one_if_exclude_each_other(tmp_path):
    src = DATACLASS_FLAG.format(other="True").replace('if True:\n    model.to("cuda")\n',
                                                       'else:\n    model.to("cuda")\n')
    script = _project(tmp_path, src)
    assert _codes(_run([str(script)]), "FSDP007") == []


def test_a_launcher_passing_one_flag_but_not_the_other_names_the_missing_one(tmp_path):
    script = _project(tmp_path, QLORA_UNDER_FLAGS, {"run_fsdp.sh": "torchrun --nproc_per_node 8 train.py --use_fsdp\n"})
    (f,) = _codes(_run([str(script)]), "FSDP202")
    assert f["severity"] == "warning"
    assert "(when args.load_in_4bit is true, line 10; when launched by " in f["message"]
    assert f["message"].endswith("run_fsdp.sh:1 with `--load_in_4bit`)")
    assert any(r["filename"].endswith("run_fsdp.sh") and r["location"]["row"] == 1 for r in f["related"])


def test_a_launcher_passing_both_flags_keeps_the_error(tmp_path):
    script = _project(tmp_path, QLORA_UNDER_FLAGS, {
        "run_fsdp.sh": "torchrun --nproc_per_node 8 train.py --use_fsdp --load_in_4bit\n"})
    (f,) = _codes(_run([str(script)]), "FSDP202")
    assert f["severity"] == "error" and "with `" not in f["message"]


def test_no_launcher_names_every_flag_the_finding_needs(tmp_path):
    script = _project(tmp_path, QLORA_UNDER_FLAGS)
    (f,) = _codes(_run([str(script)]), "FSDP202")
    assert f["severity"] == "warning"
    assert f["message"].endswith("when launched with `--load_in_4bit --use_fsdp`)")


def test_the_condition_shows_in_every_format(tmp_path):
    script = _project(tmp_path, QLORA_UNDER_FLAGS, {"run_fsdp.sh": "torchrun --nproc_per_node 8 train.py --use_fsdp\n"})
    wanted = "run_fsdp.sh:1 with `--load_in_4bit`)"
    sarif = _run([str(script)], "sarif")
    (res,) = [r for r in sarif["runs"][0]["results"] if r["ruleId"] == "FSDP202"]
    assert wanted in res["message"]["text"] and res["level"] == "warning"
    assert res["properties"]["notes"]["opt-in flags"] == "--load_in_4bit"
    for fmt in ("concise", "github"):
        out = _run([str(script)], fmt)
        (line,) = [ln for ln in out.splitlines() if "FSDP202" in ln]
        assert wanted in line


def test_a_combination_the_script_refuses_gives_no_finding(tmp_path):
    for refusal in ('if args.load_in_4bit and args.use_fsdp:\n    raise ValueError("4-bit loading is not for FSDP")\n',
                    'if args.load_in_4bit and args.use_fsdp:\n    parser.error("pick one")\n',
                    "assert not (args.load_in_4bit and args.use_fsdp)\n"):
        src = QLORA_UNDER_FLAGS.replace("quantization_config = None\n", refusal + "quantization_config = None\n")
        (tmp_path / str(len(refusal))).mkdir()
        script = _project(tmp_path / str(len(refusal)), src)
        assert _codes(_run([str(script)]), "FSDP202") == [], refusal


SWITCHES = """\
import argparse
from dataclasses import dataclass, field
from typing import Optional
from transformers import HfArgumentParser

parser = argparse.ArgumentParser()
parser.add_argument("--use_lora", action="store_true")
parser.add_argument("--no_offload", action="store_false", dest="offload")
parser.add_argument("--use_fsdp", type=str, default="False")
parser.add_argument("--compile", type=str2bool, default=False)
parser.add_argument("--strict", type=bool, default=False)
parser.add_argument("--lr", type=float, default=1e-4)
parser.add_argument("--quant", choices=["none", "4bit"], default="none")
parser.add_argument("--output_dir", type=str, default=None)
parser.add_argument("--bf16", action="store_true", default=True)
args = parser.parse_args()


@dataclass
class Opts:
    load_in_8bit: bool = field(default=False)
    use_peft: Optional[bool] = None
    gradient_checkpointing: bool = True
    lora_r: int = 8


(opts,) = HfArgumentParser(Opts).parse_args_into_dataclasses()
"""


def test_which_options_are_opt_in_flags():
    from fsdplint.launch.arguments import bind, parse_definitions

    env = bind(parse_definitions(SWITCHES, use_installed=False))
    assert env.switches == {"--use_lora": True, "--no_offload": False, "--use_fsdp": "True", "--compile": True,
                            "--strict": True, "--load_in_8bit": True, "--use_peft": True}
    # Freed, a flag holds its default and the value passing it gives; the others keep their default.
    free = bind(parse_definitions(SWITCHES, use_installed=False), free=frozenset({"--use_lora", "--use_fsdp"}))
    assert free.names["args"]["use_lora"].values == (False, True)
    assert free.names["args"]["use_fsdp"].values == ("False", "True")
    assert free.names["args"]["compile"].values == (False,)
    assert free.names["args"]["lr"].values == (1e-4,)
