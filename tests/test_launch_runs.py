"""Values of parsed arguments decide which code runs; one lint per launch, each finding naming its launch.

Everything goes through the real CLI, on scripts written to a temporary project.
"""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = ROOT / "fixtures" / "launch"
TARGETS = [
    "--target-version", "torch=2.6", "--target-version", "accelerate=1.15.0", "--target-version", "peft=0.21.2",
    "--target-version", "transformers=5.24.0", "--target-version", "bitsandbytes=0.50.2",
]

QLORA_FSDP1 = """\
import argparse
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

parser = argparse.ArgumentParser()
parser.add_argument("--load_in_4bit", action="store_true")
args = parser.parse_args()
quantization_config = None
if args.load_in_4bit:
    quantization_config = BitsAndBytesConfig(load_in_4bit=True)
model = AutoModelForCausalLM.from_pretrained("m", quantization_config=quantization_config)
model = FSDP(model, use_orig_params=True)
"""


def _run(args, cwd=None):
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--output-format", "json", *TARGETS, *args],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _project(tmp_path, script: str, shells: dict[str, str] | None = None, name="train.py") -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (root / name).write_text(textwrap.dedent(script))
    for rel, text in (shells or {}).items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root / name


def _codes(found, code):
    return [f for f in found if f["code"] == code]


def test_branch_of_an_opt_in_flag_off_by_default_is_a_warning_naming_the_flag(tmp_path):
    # `--load_in_4bit` exists to be passed: what it switches on is linted too, as a warning at most.
    script = _project(tmp_path, QLORA_FSDP1)
    (f,) = _codes(_run([str(script)]), "FSDP202")
    assert f["severity"] == "warning"
    assert f["message"].endswith("(when args.load_in_4bit is true, line 9; when launched with `--load_in_4bit`)")


def test_branch_off_by_a_default_of_another_domain_stays_quiet(tmp_path):
    # A choice, not a switch: its default decides, as before.
    script = _project(tmp_path, QLORA_FSDP1.replace(
        'parser.add_argument("--load_in_4bit", action="store_true")',
        'parser.add_argument("--quant", choices=["none", "4bit"], default="none")').replace(
        "if args.load_in_4bit:", 'if args.quant == "4bit":'))
    assert _codes(_run([str(script)]), "FSDP202") == []


def test_branch_switched_on_by_a_launch_names_condition_and_launch(tmp_path):
    script = _project(tmp_path, QLORA_FSDP1, {"scripts/sft_qlora.sh": """\
        #!/bin/bash
        torchrun --nproc_per_node 8 \\
            train.py --load_in_4bit
        """})
    (f,) = _codes(_run([str(script)]), "FSDP202")
    assert f["location"]["row"] == 10
    assert "(when args.load_in_4bit is true, line 9; when launched by " in f["message"]
    assert f["message"].endswith("sft_qlora.sh:2)")


def test_launch_on_the_command_line(tmp_path):
    script = _project(tmp_path, QLORA_FSDP1)
    (f,) = _codes(_run(["--launch", "python train.py --load_in_4bit", str(script)]), "FSDP202")
    assert "when launched by --launch:1" in f["message"]
    (f,) = _codes(_run(["--launch", "python train.py", str(script)]), "FSDP202")
    assert f["severity"] == "warning" and "when launched by --launch:1 with `--load_in_4bit`)" in f["message"]


def test_unknown_value_gives_no_finding(tmp_path):
    script = _project(tmp_path, QLORA_FSDP1.replace('action="store_true"', "type=int, default=0"))
    assert _codes(_run(["--launch", "python train.py --load_in_4bit $QUANT", str(script)]), "FSDP202") == []
    # "$@": the caller may pass anything, but nothing known switches the branch on
    assert _codes(_run(["--launch", 'python train.py "$@"', str(script)]), "FSDP202") == []


def test_default_true_reaches_the_branch(tmp_path):
    script = _project(tmp_path, QLORA_FSDP1.replace('action="store_true"', 'type=int, default=1'))
    (f,) = _codes(_run([str(script)]), "FSDP202")
    assert "(when args.load_in_4bit is true, line 9)" in f["message"] and "launched" not in f["message"]


def test_else_branch_and_conditional_keyword_values(tmp_path):
    src = """\
    import argparse
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["lora", "qlora"], default="lora")
    args = parser.parse_args()
    bnb = BitsAndBytesConfig(load_in_4bit=True if args.mode == "qlora" else None)
    if args.mode != "qlora":
        bnb = None
    model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb)
    model = FSDP(model)
    """
    script = _project(tmp_path, src)
    assert _codes(_run([str(script)]), "FSDP202") == []
    (f,) = _codes(_run(["--launch", "python train.py --mode qlora", str(script)]), "FSDP202")
    assert f["location"]["row"] == 8


def test_one_lint_per_launch_two_launchers_two_findings():
    found = _run([str(LAUNCH / "qlora_argparse" / "train_qlora.py")])
    by_code = {f["code"]: f["message"] for f in found}
    assert set(by_code) == {"FSDP201", "FSDP202"}
    assert "FSDP2" in by_code["FSDP201"] and by_code["FSDP201"].endswith("sft_qlora_fsdp2.sh:3)")
    assert "FSDP1" in by_code["FSDP202"] and by_code["FSDP202"].endswith("sft_qlora_fsdp1.sh:6)")


def test_the_same_finding_under_every_launch_is_reported_once(tmp_path):
    src = QLORA_FSDP1.replace('action="store_true"', 'type=int, default=1')
    script = _project(tmp_path, src, {"a.sh": "python train.py\n", "b.sh": "python train.py --load_in_4bit 1\n"})
    (f,) = _codes(_run([str(script)]), "FSDP202")
    assert "launched" not in f["message"]


def test_deepspeed_launch_is_not_a_run(tmp_path):
    script = _project(tmp_path, QLORA_FSDP1, {"ds.sh": "deepspeed train.py --load_in_4bit\n"})
    found = _codes(_run([str(script)]), "FSDP202")
    # Only the script's defaults (and its opt-in flag) run it: a warning that names no launcher.
    assert [f["severity"] for f in found] == ["warning"]
    assert "ds.sh" not in found[0]["message"] and found[0]["message"].endswith("with `--load_in_4bit`)")


# -- a finding caused by a launcher points at the launcher's line, in every format -------------------
FLAGS = LAUNCH / "accelerate_flags"


def _cli(fmt):
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--output-format", fmt, *TARGETS,
                                  str(FLAGS / "train_low_ram.py")], catch_exceptions=False)
    return r.stdout


def test_launcher_finding_points_at_the_flag_line_json():
    (f,) = json.loads(_cli("json"))
    assert (Path(f["filename"]).name, f["code"], f["location"]["row"]) == ("launch_no_sync.sh", "FSDP011", 10)


@pytest.mark.parametrize("fmt", ["concise", "full", "github", "json-lines", "sarif", "junit"])
def test_launcher_finding_points_at_the_flag_line_every_format(fmt):
    out = _cli(fmt)
    if fmt == "sarif":
        (res,) = json.loads(out)["runs"][0]["results"]
        loc = res["locations"][0]["physicalLocation"]
        assert loc["artifactLocation"]["uri"].endswith("launch_no_sync.sh") and loc["region"]["startLine"] == 10
    elif fmt == "junit":
        root = ET.fromstring(out)
        text = ET.tostring(root, encoding="unicode")
        assert "launch_no_sync.sh" in text and ":10" in text
    else:
        if fmt == "json-lines":
            (f,) = [json.loads(x) for x in out.splitlines() if x.strip()]
            assert f["filename"].endswith("launch_no_sync.sh") and f["location"]["row"] == 10
        assert "launch_no_sync.sh" in out and ("launch_no_sync.sh:10" in out or "line=10" in out or fmt == "json-lines")
        if fmt == "full":
            assert "--fsdp_sync_module_states false" in out


def test_noqa_in_the_shell_script(tmp_path):
    line = ("accelerate launch --use_fsdp --fsdp_cpu_ram_efficient_loading true --fsdp_sync_module_states false "
            "train_low_ram.py")
    src = (FLAGS / "train_low_ram.py").read_text()
    script = _project(tmp_path, src, {"run.sh": line + "\n"}, name="train_low_ram.py")
    (f,) = _run([str(script)])
    assert (Path(f["filename"]).name, f["code"], f["location"]["row"]) == ("run.sh", "FSDP011", 1)
    (script.parent / "run.sh").write_text(line + "  # noqa: FSDP011\n")
    assert _run([str(script)]) == []


# -- the fixtures: fixtures/launch/<case>/expected.json -----------------------------------------------
CASES = sorted(p.parent for p in LAUNCH.glob("*/expected.json"))


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_launch_fixture(case):
    expected = json.loads((case / "expected.json").read_text())
    for script, want in expected.items():
        found = _run([str(case / script)])
        got = sorted([Path(f["filename"]).name, f["code"], f["location"]["row"],
                      f["message"].rsplit("when launched by ", 1)[-1].rstrip(")") if "launched by" in f["message"] else ""]
                     for f in found)
        want = sorted([w["file"], w["code"], w["line"], w.get("launch", "")] for w in want)
        got = [[g[0], g[1], g[2], Path(g[3]).name if g[3] else ""] for g in got]
        assert got == want, f"{case.name}/{script}"


def test_launch_option_errors_are_one_line():
    for cmd, why in [("echo hello", "no Python script or module is launched there"),
                     ("deepspeed train.py", "it launches a deepspeed job, not FSDP")]:
        r = CliRunner().invoke(main, ["check", "--isolated", "--launch", cmd, "x.py"])
        assert r.exit_code == 2 and why in r.output and "Traceback" not in r.output


def test_launches_and_library_dataclasses_import_no_heavy_library(tmp_path):
    """Reading TrainingArguments' fields from the installed transformers source must not import it."""
    import subprocess
    import sys

    script = _project(tmp_path, """\
        from transformers import HfArgumentParser, TrainingArguments, BitsAndBytesConfig
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        parser = HfArgumentParser((TrainingArguments,))
        (training_args,) = parser.parse_args_into_dataclasses()
        if training_args.bf16:
            model = FSDP(model)
        """, {"run.sh": "torchrun train.py --bf16 --fsdp full_shard\n"})
    probe = (
        "import sys\nfrom fsdplint.cli import main\n"
        f"try:\n    main(['--isolated', {str(script)!r}, '--output-format', 'json'])\n"
        "except SystemExit:\n    pass\n"
        "print('HEAVY:', sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'peft', 'transformers', 'accelerate', 'bitsandbytes', 'trl')))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "HEAVY: []" in out, out


def test_the_launch_is_the_other_half_sarif_related_locations_and_full_text():
    script = str(LAUNCH / "qlora_argparse" / "train_qlora.py")
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--output-format", "sarif", *TARGETS, script])
    results = {res["ruleId"]: res for res in json.loads(r.stdout)["runs"][0]["results"]}
    (rel,) = results["FSDP201"]["relatedLocations"]
    assert rel["physicalLocation"]["artifactLocation"]["uri"].endswith("sft_qlora_fsdp2.sh")
    assert rel["physicalLocation"]["region"]["startLine"] == 3
    assert results["FSDP201"]["properties"]["notes"]["launched by"].endswith("sft_qlora_fsdp2.sh:3")
    schema = ROOT.parent / "shared" / "data" / "sarif-schema-2.1.0.json"
    if schema.is_file():
        jsonschema = pytest.importorskip("jsonschema")
        spec = json.loads(schema.read_text(encoding="utf-8"))
        errors = list(jsonschema.validators.validator_for(spec)(spec).iter_errors(json.loads(r.stdout)))
        assert not errors, [e.message for e in errors]
    full = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--output-format", "full", *TARGETS,
                                     script]).stdout
    # The related location line: the launcher's file, line and what it is.
    assert any(line.strip().startswith("=") and "sft_qlora_fsdp2.sh:3:" in line
               and line.endswith("the launch that leads to this finding") for line in full.splitlines())


LORA_PREPARE = """\
import os
import torch
from accelerate import Accelerator
from peft import LoraConfig
from transformers import AutoModelForCausalLM


def main():
    {env}
    accelerator = Accelerator(mixed_precision="bf16")
    model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
    model.requires_grad_(False)
    model.add_adapter(LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    model, optimizer = accelerator.prepare(model, optimizer)


main()
"""


@pytest.mark.parametrize("env,fsdp1_finding", [
    ("pass", True),  # `accelerate launch --use_fsdp`: FSDP1, use_orig_params false from the environment
    ('os.environ["FSDP_VERSION"] = "2"', False),  # the script switches accelerate to FSDP2 itself
    ('os.environ["FSDP_USE_ORIG_PARAMS"] = "true"', False),
])
def test_fsdp_settings_the_script_writes_into_its_environment_win(tmp_path, env, fsdp1_finding):
    script = _project(tmp_path, LORA_PREPARE.format(env=env),
                      {"launch.sh": "accelerate launch --use_fsdp --num_processes 8 train.py\n"})
    found = _run([str(script)])
    assert bool(_codes(found, "FSDP004")) is fsdp1_finding, found


DEVICE_MAP_ON_A_PATH = """\
import argparse
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoModelForCausalLM

def load(args):
    placement = None
    if args.load_in_4bit:
        placement = "auto"
    return AutoModelForCausalLM.from_pretrained("m", device_map=placement)

parser = argparse.ArgumentParser()
parser.add_argument("--load_in_4bit", action="store_true")
args = parser.parse_args()
model = load(args)
model = FSDP(model, use_orig_params=True)
"""


def test_device_map_set_on_a_path_follows_the_launch(tmp_path):
    script = _project(tmp_path, DEVICE_MAP_ON_A_PATH)
    (f,) = _codes(_run(["--launch", "torchrun --nproc_per_node 8 train.py --load_in_4bit", str(script)]), "FSDP009")
    assert f["severity"] == "error" and f["location"]["row"] == 9
    (f,) = _codes(_run(["--launch", "torchrun --nproc_per_node 8 train.py", str(script)]), "FSDP009")
    assert f["severity"] == "warning" and f["message"].endswith("with `--load_in_4bit`)")
    assert _codes(_run(["--launch", "torchrun --nproc_per_node 8 train.py $QUANT", str(script)]), "FSDP009") == []


def test_device_map_set_on_a_path_of_unknown_options_is_a_warning(tmp_path):
    src = DEVICE_MAP_ON_A_PATH.split("parser = ")[0] + "def main(opts):\n    model = load(opts)\n    model = FSDP(model)\n"
    script = _project(tmp_path, src)
    (f,) = _codes(_run([str(script)]), "FSDP009")
    assert f["severity"] == "warning" and "(when args.load_in_4bit)" in f["message"]


DEVICE_MAP_UNDER_FLAG = """\
import argparse
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--use_4bit", action="store_true")
args = parser.parse_args()
device_map = None
if args.use_4bit:
    device_map = "auto"
model = AutoModelForCausalLM.from_pretrained("m", device_map=device_map)
Trainer(model=model, args=TrainingArguments("out")).train()
"""
FSDP_YAML = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"


@pytest.mark.parametrize("fsdp_launch_flags, expected", [("", "warning"), (" --use_4bit", "error")])
def test_a_plain_python_launch_does_not_borrow_another_launchers_fsdp_config(tmp_path, fsdp_launch_flags, expected):
    """`python train.py --use_4bit` is one process without FSDP; the FSDP config belongs to the accelerate
    launcher of the same script, which passes the 4-bit flag only in the second variant (in the first, the
    flag is the user's to pass: a warning that names it)."""
    script = _project(tmp_path, DEVICE_MAP_UNDER_FLAG, {
        "run_single.sh": "python train.py --use_4bit\n",
        "run_fsdp.sh": f"accelerate launch --config_file configs/fsdp.yaml train.py{fsdp_launch_flags}\n",
        "configs/fsdp.yaml": FSDP_YAML,
    })
    (f,) = _codes(_run([str(script)]), "FSDP009")
    assert f["severity"] == expected
    assert "run_fsdp.sh:1" in f["message"] and "run_single.sh" not in f["message"]
    assert f["message"].endswith("run_fsdp.sh:1 with `--use_4bit`)") == (expected == "warning")
