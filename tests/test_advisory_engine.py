"""FSDP601's engine: unknown versions, declared ranges, the finding at the pin, and training-tool YAML jobs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main
from fsdplint.registry import all_rules
from fsdplint.rule import Valid
from rule_harness import lint_example

RULE = next(r for r in all_rules() if r.code == "FSDP601")
STATE_FSDP1 = "bitsandbytes-8bit-optim-state-fsdp1"
CPU_OFFLOAD = "bitsandbytes-8bit-optim-cpu-offload"
IGNORED_PARAMS = "accelerate-fsdp2-ignored-params-old-torch"

# An FSDP1 wrap, a bitsandbytes 8-bit optimizer and a save of its state: the FSDP1 optimizer-state advisory.
FSDP1_SAVE = """\
import bitsandbytes as bnb
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
model = FSDP(model, use_orig_params=True)
optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=1e-4)
torch.save(FSDP.optim_state_dict(model, optimizer), "optim.pt")
"""
PREPARED = """\
from accelerate import Accelerator
accelerator = Accelerator()
model = accelerator.prepare(model)
"""
FSDP2_YAML = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"


def _hits(code, advisory, **kw):
    return [f for f in lint_example(RULE, Valid(code, **kw)) if advisory in f.message]


def _check(*paths):
    r = CliRunner().invoke(main, ["check", *map(str, paths), "--select", "FSDP601", "--output-format", "json",
                                  "--exit-zero", "--isolated"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def _project(tmp_path: Path, files: dict) -> Path:
    (tmp_path / ".git").mkdir(parents=True)
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return tmp_path


def test_unknown_version_warns_with_the_range_and_what_decides_it():
    found = _hits(FSDP1_SAVE, STATE_FSDP1)
    assert len(found) == 1 and found[0].severity.value == "warning" and found[0].start.row == 5
    msg = found[0].message
    assert "bitsandbytes before 0.49.2" in msg and "Fixed in bitsandbytes 0.49.2" in msg
    assert "--target-version bitsandbytes=X" in msg and "pin it in requirements" in msg


def test_unknown_second_library_is_named_and_two_unknowns_are_silent():
    yaml = {"accelerate_config": FSDP2_YAML}
    found = _hits(PREPARED, IGNORED_PARAMS, target={"accelerate": "1.11.0"}, options=yaml)
    assert found and found[0].severity.value == "warning" and "--target-version torch=X" in found[0].message
    assert "--target-version accelerate" not in found[0].message
    assert not _hits(PREPARED, IGNORED_PARAMS, target={"accelerate": "1.13.0"}, options=yaml)  # known and fixed
    assert not _hits(PREPARED, IGNORED_PARAMS, options=yaml)  # neither version known: a guess


def test_unknown_version_with_a_likely_trigger_is_silent():
    adv = "accelerate-fsdp2-ram-efficient-loading-cpu-offload"
    code = """\
import os
from accelerate import Accelerator
def setup(cfg):
    os.environ["ACCELERATE_USE_FSDP"] = "true"
    os.environ["FSDP_VERSION"] = "2"
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "true"
    if cfg.offload_params:
        os.environ["FSDP_OFFLOAD_PARAMS"] = "true"
    return Accelerator().prepare(model)
"""
    assert _hits(code, adv, target={"accelerate": "1.12.0"})  # a known version: the likely trigger warns
    assert not _hits(code, adv)  # likely trigger and unknown version: nothing
    certain = code.replace("    if cfg.offload_params:\n        os.environ", "    os.environ")
    found = _hits(certain, adv)
    assert found and all(f.severity.value == "warning" for f in found)
    assert "--target-version accelerate=X" in found[0].message


def test_declared_range_that_admits_the_fix_is_a_warning(tmp_path):
    for req, severity in (("bitsandbytes>=0.48\n", "warning"), ("bitsandbytes>=0.48,<0.49.2\n", "error"),
                          ("bitsandbytes==0.49.1\n", "error")):
        root = _project(tmp_path / severity / req.count(",").__str__(), {"train.py": FSDP1_SAVE,
                                                                          "requirements.txt": req})
        found = [f for f in _check(root / "train.py") if STATE_FSDP1 in f["message"]]
        at_script = [f for f in found if f["filename"].endswith("train.py")]
        assert len(at_script) == 1 and at_script[0]["severity"] == severity, (req, found)
        if severity == "warning":
            assert "also admits bitsandbytes 0.49.2" in at_script[0]["message"]


def test_pin_is_reported_once_with_the_trigger_as_related(tmp_path):
    root = _project(tmp_path, {
        "a.py": FSDP1_SAVE, "sub/b.py": FSDP1_SAVE,
        "requirements.txt": "torch==2.6.0\n# optimizers\nbitsandbytes==0.49.1  # 8-bit Adam\n",
    })
    found = _check(root)
    pins = [f for f in found if f["filename"].endswith("requirements.txt")]
    assert len(pins) == 1 and pins[0]["location"]["row"] == 3 and STATE_FSDP1 in pins[0]["message"]
    assert pins[0]["severity"] == "error"
    assert pins[0]["related"][0]["filename"].endswith(("a.py", "b.py")) and pins[0]["related"][0]["location"]["row"] == 5
    # The fixed release: neither the script nor the pin.
    fixed = _project(tmp_path / "fixed", {"a.py": FSDP1_SAVE, "requirements.txt": "bitsandbytes==0.49.2\n"})
    assert not [f for f in _check(fixed) if STATE_FSDP1 in f["message"]]


def test_pin_in_pyproject_and_lock_file(tmp_path):
    pyproject = '[project]\nname = "job"\nversion = "0.1"\ndependencies = [\n  "torch>=2.6",\n  "bitsandbytes==0.49.1",\n]\n'
    root = _project(tmp_path / "py", {"train.py": FSDP1_SAVE, "pyproject.toml": pyproject})
    pins = [f for f in _check(root) if f["filename"].endswith("pyproject.toml")]
    assert [p["location"]["row"] for p in pins] == [6]
    lock = ('version = 1\n\n[[package]]\nname = "torch"\nversion = "2.6.0"\n\n'
            '[[package]]\nname = "bitsandbytes"\nversion = "0.49.1"\n')
    root = _project(tmp_path / "uv", {"train.py": FSDP1_SAVE, "pyproject.toml": pyproject.replace("==0.49.1", ">=0.45"),
                                      "uv.lock": lock})
    found = _check(root)
    pins = [f for f in found if f["filename"].endswith("uv.lock")]
    assert [p["location"]["row"] for p in pins] == [8], found
    assert not [f for f in found if f["filename"].endswith("pyproject.toml")]


def test_noqa_on_the_pin_line(tmp_path):
    root = _project(tmp_path, {"a.py": FSDP1_SAVE, "requirements.txt": "bitsandbytes==0.49.1  # noqa: FSDP601\n"})
    found = _check(root)
    assert not [f for f in found if f["filename"].endswith("requirements.txt")]
    assert [f for f in found if f["filename"].endswith("a.py")]


AXOLOTL = """\
base_model: meta-llama/Llama-3.1-8B
load_in_4bit: true
adapter: qlora
lora_r: 16
lora_target_linear: true
sequence_len: 2048
micro_batch_size: 1
optimizer: paged_adamw_8bit
fsdp_version: 2
fsdp_config:
  offload_params: true
"""
LLAMAFACTORY = """\
model_name_or_path: meta-llama/Llama-3.1-8B
stage: sft
finetuning_type: lora
lora_target: all
template: llama3
optim: adamw_bnb_8bit
fsdp: full_shard offload auto_wrap
"""


def test_tool_yaml_facts_trigger_at_the_yaml_line(tmp_path):
    for name, text, row in (("axolotl.yml", AXOLOTL, 8), ("lf.yaml", LLAMAFACTORY, 6)):
        root = _project(tmp_path / name, {name: text, "requirements.txt": "bitsandbytes==0.49.1\n"})
        found = [f for f in _check(root / name) if CPU_OFFLOAD in f["message"]]
        at = {(Path(f["filename"]).name, f["location"]["row"]) for f in found}
        assert at == {(name, row), ("requirements.txt", 1)}, found
        fixed = _project(tmp_path / "fixed" / name, {name: text, "requirements.txt": "bitsandbytes==0.50.0\n"})
        assert not [f for f in _check(fixed / name) if CPU_OFFLOAD in f["message"]]
        # No offload: the optimizer steps on the GPU.
        on_gpu = text.replace("  offload_params: true\n", "  reshard_after_forward: true\n").replace(" offload", "")
        root = _project(tmp_path / "gpu" / name, {name: on_gpu, "requirements.txt": "bitsandbytes==0.49.1\n"})
        assert not [f for f in _check(root / name) if CPU_OFFLOAD in f["message"]]


def test_tool_version_of_the_checkout_itself(tmp_path):
    # A checkout of LLaMA-Factory: hatch reads its version from extras/env.py.
    root = _project(tmp_path, {
        "pyproject.toml": '[project]\nname = "llamafactory"\ndynamic = ["version"]\n'
                          '[tool.hatch.version]\npath = "src/llamafactory/extras/env.py"\n',
        "src/llamafactory/extras/env.py": 'VERSION = "0.9.4.dev0"\n',
    })
    from fsdplint.launch.tools.defaults import tool_version

    tv = tool_version("llamafactory", root / "examples" / "x.yaml", use_installed=False)
    assert tv is not None and str(tv.version) == "0.9.4" and "env.py" in tv.source
    (root / "pyproject.toml").write_text('[project]\nname = "axolotl"\ndynamic = ["version"]\n'
                                         '[tool.setuptools.dynamic]\nversion = { file = "VERSION" }\n')
    (root / "VERSION").write_text("0.12.2\n")
    tv = tool_version("axolotl", root / "examples" / "x.yaml", use_installed=False)
    assert tv is not None and str(tv.version) == "0.12.2"


def test_llamafactory_reentrant_checkpointing_default_and_its_workaround(tmp_path):
    adv = "llamafactory-fsdp2-reentrant-gradient-checkpointing"
    yaml = ("model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\nlora_target: all\n"
            "template: llama3\nfsdp: full_shard auto_wrap\nfsdp_config:\n  version: 2\n")
    for name, text, expected in (("default", yaml, True), ("off", yaml + "use_reentrant_gc: false\n", False),
                                 ("no-gc", yaml + "disable_gradient_checkpointing: true\n", False),
                                 ("fsdp1", yaml.replace("  version: 2\n", "  version: 1\n"), False)):
        root = _project(tmp_path / name, {"lf.yaml": text, "requirements.txt": "llamafactory==0.9.3\n"})
        found = [f for f in _check(root / "lf.yaml") if adv in f["message"]]
        assert bool(found) is expected, (name, found)
        if found:
            assert found[0]["severity"] == "warning" and found[0]["location"]["row"] == 8


def test_torchao_low_bit_optimizer_is_no_bitsandbytes_optimizer(tmp_path):
    for optim, expected in (("adamw_torch_8bit", False), ("adamw_bnb_8bit", True), ("paged_adamw_8bit", True)):
        text = AXOLOTL.replace("paged_adamw_8bit", optim)
        root = _project(tmp_path / optim, {"axolotl.yml": text, "requirements.txt": "bitsandbytes==0.49.1\n"})
        found = [f for f in _check(root / "axolotl.yml") if CPU_OFFLOAD in f["message"]]
        assert bool(found) is expected, (optim, found)
    script = ('from transformers import Trainer, TrainingArguments\n'
              'args = TrainingArguments("out", fsdp="full_shard offload auto_wrap", optim="adamw_torch_8bit")\n'
              'Trainer(model=model, args=args).train()\n')
    assert not _hits(script, CPU_OFFLOAD, target={"bitsandbytes": "0.49.1"})
    assert _hits(script.replace("adamw_torch_8bit", "adamw_8bit"), CPU_OFFLOAD, target={"bitsandbytes": "0.49.1"})


def test_accelerate_fsdp2_advisory_on_an_axolotl_job_that_replaces_the_code(tmp_path):
    adv = "accelerate-fsdp2-size-based-wrap-numel"
    text = AXOLOTL.replace("  offload_params: true\n", "  auto_wrap_policy: SIZE_BASED_WRAP\n")
    for name, pins, expected in (("unknown", "accelerate==1.6.0\n", "warning"),
                                 ("patched", "accelerate==1.6.0\naxolotl==0.16.1\n", None),
                                 ("before-patch", "accelerate==1.6.0\naxolotl==0.11.0\n", "error")):
        root = _project(tmp_path / name, {"axolotl.yml": text, "requirements.txt": pins})
        found = [f for f in _check(root / "axolotl.yml") if adv in f["message"] and f["filename"].endswith(".yml")]
        assert [f["severity"] for f in found] == ([expected] if expected else []), (name, found)
        if expected == "warning":
            assert "axolotl replaces accelerate.utils.fsdp_utils.fsdp2_prepare_model" in found[0]["message"]
    # An accelerate bug outside the replaced code still applies to the patched axolotl: the offload backend.
    root = _project(tmp_path / "backend", {"axolotl.yml": AXOLOTL,
                                           "requirements.txt": "accelerate==1.6.0\naxolotl==0.16.1\n"})
    assert [f for f in _check(root / "axolotl.yml") if "accelerate-fsdp2-cpu-offload-nccl-backend" in f["message"]]
    # The same settings in an accelerate config of a script: accelerate's own code runs, an error.
    yaml = FSDP2_YAML + "  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n"
    found = _hits(PREPARED, adv, target={"accelerate": "1.6.0"}, options={"accelerate_config": yaml})
    assert found and found[0].severity.value == "error"


def test_mixed_precision_in_each_place_it_is_written():
    adv = "accelerate-fsdp2-mixed-precision-upcasts-frozen-base"
    peft = "from peft import LoraConfig, get_peft_model\nmodel = get_peft_model(model, LoraConfig(target_modules=['q_proj']))\n"
    fsdp2 = {"accelerate_config": FSDP2_YAML}
    in_code = peft + "from accelerate import Accelerator\naccelerator = Accelerator(mixed_precision='bf16')\nmodel = accelerator.prepare(model)\n"
    found = _hits(in_code, adv, target={"accelerate": "1.12.0"}, options=fsdp2)
    assert [f.start.row for f in found] == [4]
    assert not _hits(in_code.replace("'bf16'", "'no'"), adv, target={"accelerate": "1.12.0"}, options=fsdp2)
    trainer = peft + ("from transformers import Trainer, TrainingArguments\n"
                      "args = TrainingArguments('out', bf16=True, fsdp='full_shard auto_wrap', fsdp_config={'version': 2})\n"
                      "Trainer(model=model, args=args).train()\n")
    found = _hits(trainer, adv, target={"accelerate": "1.12.0", "transformers": "4.57.0"})
    assert [f.start.row for f in found] == [4]
    assert not _hits(trainer, adv, target={"accelerate": "1.13.0", "transformers": "4.57.0"})


def test_lora_on_an_embedding_layer_in_axolotl_targets(tmp_path):
    adv = "axolotl-fsdp2-lora-embedding-fully-shard-parameter"
    base = AXOLOTL.replace("lora_target_linear: true\n", "lora_target_modules: [q_proj, v_proj, embed_tokens]\n")
    for name, text, expected in (("embed", base, True), ("linear", AXOLOTL, False),
                                 ("fsdp1", base.replace("fsdp_version: 2", "fsdp_version: 1"), False)):
        root = _project(tmp_path / name, {"axolotl.yml": text, "requirements.txt": "axolotl==0.14.0\n"})
        found = [f for f in _check(root / "axolotl.yml") if adv in f["message"]]
        assert bool(found) is expected, (name, found)
        if found:
            assert found[0]["location"]["row"] == 5 and found[0]["severity"] == "error"


def test_unknown_version_of_a_bug_fixed_before_the_oldest_covered_release_is_silent():
    # peft's FSDP auto-wrap bug was fixed in peft 0.11.0, before the oldest peft fsdplint covers (0.13.0).
    adv = "peft-fsdp-auto-wrap-policy-accelerate-0-30"
    code = """\
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer
args = SFTConfig("out", fsdp="full_shard auto_wrap")
trainer = SFTTrainer(model=model, args=args, peft_config=LoraConfig(r=8))
"""
    assert _hits(code, adv, target={"accelerate": "1.0.0", "peft": "0.10.0"})
    assert not _hits(code, adv, target={"accelerate": "1.0.0"})


def test_llamafactory_reference_model_under_fsdp2(tmp_path):
    adv = "llamafactory-dpo-kto-ref-model-fsdp2"
    yaml = ("model_name_or_path: meta-llama/Llama-3.1-8B\nstage: dpo\nfinetuning_type: full\ntemplate: llama3\n"
            "fsdp: full_shard auto_wrap\nfsdp_config:\n  version: 2\n")
    pins = "llamafactory==0.9.4\naccelerate==1.12.0\n"
    for name, text, req, expected in (
            ("dpo", yaml, pins, True), ("kto", yaml.replace("stage: dpo", "stage: kto"), pins, True),
            ("lora", yaml.replace("finetuning_type: full", "finetuning_type: lora"), pins, False),
            ("sft", yaml.replace("stage: dpo", "stage: sft"), pins, False),
            ("old-accelerate", yaml, pins.replace("1.12.0", "1.7.0"), False),
            ("fixed", yaml, pins.replace("0.9.4", "0.9.5"), False)):
        root = _project(tmp_path / name, {"lf.yaml": text, "requirements.txt": req})
        found = [f for f in _check(root / "lf.yaml") if adv in f["message"] and f["filename"].endswith("lf.yaml")]
        assert bool(found) is expected, (name, found)
        if found:
            assert found[0]["severity"] == "error" and found[0]["location"]["row"] == 7


def test_the_checkout_of_the_library_itself_has_no_pin(tmp_path):
    # Linting bitsandbytes' own repository: its version is the checkout's, not a requirement to point at.
    root = _project(tmp_path, {"pyproject.toml": '[project]\nname = "bitsandbytes"\nversion = "0.49.1"\n',
                               "examples/train.py": FSDP1_SAVE})
    found = [f for f in _check(root) if STATE_FSDP1 in f["message"]]
    assert [Path(f["filename"]).name for f in found] == ["train.py"]


def test_an_accelerate_bug_is_not_reported_on_a_job_that_wraps_with_torch_itself():
    # accelerate's FSDP2 preparation passes ignored_params (torch < 2.7 refuses it); a script that calls
    # fully_shard itself never runs that preparation, whatever the versions.
    adv = "accelerate-fsdp2-ignored-params-old-torch"
    own = ("import torch\nfrom torch.distributed.fsdp import fully_shard\n"
           "model = torch.nn.Linear(4, 4)\nfully_shard(model)\n")
    assert not _hits(own, adv, target={"accelerate": "1.12.0", "torch": "2.6.0"})
    assert not _hits(own, adv)
    through = ("from accelerate import Accelerator\nfrom accelerate.utils import FullyShardedDataParallelPlugin\n"
               "acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))\n"
               "model = acc.prepare(model)\n")
    found = _hits(through, adv, target={"accelerate": "1.12.0", "torch": "2.6.0"})
    assert found, "the same versions through accelerate's preparation are affected"



# peft's fsdp_auto_wrap_policy bug: peft < 0.11.0 with accelerate >= 0.30.0, reached through the Trainer (from
# transformers 4.39.0) for a LoRA model under FSDP1.
AUTO_WRAP = "peft-fsdp-auto-wrap-policy-accelerate-0-30"
SFT_LORA = """\
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer
args = SFTConfig("out", fsdp="full_shard auto_wrap")
trainer = SFTTrainer(model=model, args=args, peft_config=LoraConfig(r=8))
"""


def test_a_declared_range_that_admits_an_affected_release_of_a_second_library_warns(tmp_path):
    # The ranges' lower bounds (accelerate 0.27.2, transformers 4.37.2) are not affected, but both ranges admit
    # releases that are: a warning that names the admitted release, in each place requirements are written.
    ranges = ("peft>=0.10.0", "accelerate>=0.27.2", "transformers>=4.37.2")
    shapes = {
        "requirements.txt": "\n".join(ranges) + "\n",
        "pyproject.toml": '[project]\nname = "job"\nversion = "0.1"\ndependencies = [\n'
                          + "".join(f'  "{r}",\n' for r in ranges) + "]\n",
        "setup.py": "from setuptools import setup\nsetup(name='job', install_requires=[\n"
                    + "".join(f"    '{r}',\n" for r in ranges) + "])\n",
    }
    for name, text in shapes.items():
        root = _project(tmp_path / name.replace(".", "-"), {"train.py": SFT_LORA, name: text})
        found = [f for f in _check(root / "train.py") if AUTO_WRAP in f["message"] and f["filename"].endswith("train.py")]
        assert len(found) == 1 and found[0]["severity"] == "warning", (name, found)
        assert "admits accelerate 0.30.0" in found[0]["message"] and "admits transformers 4.39.0" in found[0]["message"]
        # A range that stops before the affected releases says the job is not affected.
        capped = text.replace("accelerate>=0.27.2", "accelerate>=0.27.2,<0.30")
        root = _project(tmp_path / "capped" / name.replace(".", "-"), {"train.py": SFT_LORA, name: capped})
        assert not [f for f in _check(root / "train.py") if AUTO_WRAP in f["message"]], name
    # Exact pins of an affected pair: an error.
    root = _project(tmp_path / "pins", {"train.py": SFT_LORA,
                                        "requirements.txt": "peft==0.10.0\naccelerate==0.30.1\ntransformers==4.40.0\n"})
    found = [f for f in _check(root / "train.py") if AUTO_WRAP in f["message"] and f["filename"].endswith("train.py")]
    assert len(found) == 1 and found[0]["severity"] == "error"


def test_a_range_admitting_a_bug_of_one_patch_release_is_silent(tmp_path):
    # transformers 4.47.0 alone builds the optimizer before the FSDP1 wrap: a range that admits 4.47.0 among
    # every other release is no sign of it (an exact pin is).
    adv = "transformers-fsdp1-optimizer-before-wrap"
    code = ("from transformers import Trainer, TrainingArguments\n"
            "args = TrainingArguments('out', fsdp='full_shard auto_wrap')\nTrainer(model=model, args=args).train()\n")
    root = _project(tmp_path / "range", {"train.py": code, "requirements.txt": "transformers>=4.40\n"})
    assert not [f for f in _check(root / "train.py") if adv in f["message"]]
    root = _project(tmp_path / "pin", {"train.py": code, "requirements.txt": "transformers==4.47.0\n"})
    assert [f for f in _check(root / "train.py") if adv in f["message"]]


LF_FSDP = "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_offload_params: false\n"


def test_llamafactory_trains_with_the_trainer_in_a_yaml_job_and_a_launch_given_on_the_command_line(tmp_path, monkeypatch):
    pins = "peft==0.10.0\naccelerate==0.30.1\ntransformers==4.40.0\n"
    yaml = "model_name_or_path: m\nstage: sft\nfinetuning_type: lora\nlora_target: q_proj,v_proj\ntemplate: llama3\n"
    fsdp = "fsdp: full_shard auto_wrap\n"
    # The YAML job: LLaMA-Factory's sft stage is a Seq2SeqTrainer subclass (also when no stage is written).
    for name, text in (("sft", yaml + fsdp), ("default-stage", yaml.replace("stage: sft\n", "") + fsdp)):
        root = _project(tmp_path / name, {"lf.yaml": text, "requirements.txt": pins})
        found = [f for f in _check(root / "lf.yaml") if AUTO_WRAP in f["message"] and f["filename"].endswith("lf.yaml")]
        assert len(found) == 1 and found[0]["severity"] == "error", (name, found)
    # Full fine-tuning has no adapter: not this bug.
    root = _project(tmp_path / "full", {"lf.yaml": yaml.replace("lora", "full") + fsdp, "requirements.txt": pins})
    assert not [f for f in _check(root / "lf.yaml") if AUTO_WRAP in f["message"]]
    # The same job as the flags of a command given with --launch (it replaces the project's launchers): the
    # accelerate config it names is linted with the job, whose values point at the command.
    root = _project(tmp_path / "launch", {"examples/accelerate/fsdp.yaml": LF_FSDP, "src/train.py": "print()\n",
                                          "requirements.txt": pins})
    monkeypatch.chdir(root)
    cmd = ("accelerate launch --config_file examples/accelerate/fsdp.yaml src/train.py --stage sft "
           "--model_name_or_path m --finetuning_type lora --lora_target q_proj,v_proj --template llama3")
    r = CliRunner().invoke(main, ["check", ".", "--select", "FSDP601", "--output-format", "json", "--exit-zero",
                                  "--isolated", "--launch", cmd])
    found = [f for f in json.loads(r.output) if AUTO_WRAP in f["message"]]
    assert {f["filename"] for f in found} == {"--launch", "requirements.txt"}, found
    assert all(f["severity"] == "error" for f in found)
    # Without the command, the project has no launcher: no job.
    r = CliRunner().invoke(main, ["check", ".", "--select", "FSDP601", "--output-format", "json", "--exit-zero",
                                  "--isolated"])
    assert not [f for f in json.loads(r.output) if AUTO_WRAP in f["message"]]


OUMI = """\
model:
  model_name: meta-llama/Llama-3.1-8B-Instruct
  torch_dtype_str: bfloat16
training:
  trainer_type: TRL_SFT
  use_peft: true
  save_steps: 200
  optimizer: paged_adamw_8bit
peft:
  q_lora: true
  lora_r: 16
fsdp:
  enable_fsdp: true
  auto_wrap_policy: TRANSFORMER_BASED_WRAP
"""
TRL_SCRIPT = """\
from trl import ModelConfig, ScriptArguments, SFTConfig, SFTTrainer, TrlParser, get_peft_config


def main():
    parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    trainer = SFTTrainer(model=model_args.model_name_or_path, args=training_args,
                         peft_config=get_peft_config(model_args))
    trainer.train()


if __name__ == "__main__":
    main()
"""


def test_the_optimizer_setting_in_each_tools_yaml(tmp_path):
    # One advisory (bitsandbytes' 8-bit state under FSDP1, saved at each checkpoint), the optimizer written
    # the way each tool spells it: axolotl `optimizer:`, LLaMA-Factory `optim:`, Oumi `training.optimizer:`, and
    # a trl recipe's `optim:` (a TrainingArguments field the script's parser reads).
    shapes = {
        "axolotl": ({"job.yml": AXOLOTL.replace("fsdp_version: 2", "fsdp_version: 1").replace(
            "  offload_params: true\n", "  reshard_after_forward: true\nsave_steps: 100\n")}, "job.yml", 8),
        "llamafactory": ({"job.yaml": LLAMAFACTORY.replace(" offload", "").replace("adamw_bnb_8bit", "adamw_8bit")
                          + "fsdp_config:\n  version: 1\nsave_steps: 500\n"}, "job.yaml", 6),
        "oumi": ({"job.yaml": OUMI}, "job.yaml", 8),
        "trl-recipe": ({"train.py": TRL_SCRIPT, "recipes/sft.yaml": "model_name_or_path: m\noutput_dir: out\n"
                        "optim: paged_adamw_8bit\nuse_peft: true\n",
                        "recipes/fsdp.yaml": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n",
                        "run.sh": "accelerate launch --config_file recipes/fsdp.yaml train.py --config recipes/sft.yaml\n"},
                       "recipes/sft.yaml", 3),
    }
    for tool, (files, where, row) in shapes.items():
        for pin, expected in (("bitsandbytes==0.49.1\n", True), ("bitsandbytes==0.49.2\n", False)):
            root = _project(tmp_path / tool / pin.strip(), {**files, "requirements.txt": pin})
            found = [f for f in _check(root) if STATE_FSDP1 in f["message"] and f["filename"].endswith(where)]
            assert bool(found) is expected, (tool, pin, found)
            if expected:
                assert found[0]["location"]["row"] == row, (tool, found)
        # A 32-bit optimizer: nothing.
        plain = {k: v.replace("paged_adamw_8bit", "adamw_torch").replace("adamw_8bit", "adamw_torch")
                 for k, v in files.items()}
        root = _project(tmp_path / tool / "32bit", {**plain, "requirements.txt": "bitsandbytes==0.49.1\n"})
        assert not [f for f in _check(root) if STATE_FSDP1 in f["message"]], tool


def test_oumi_fsdp_and_checkpoints_from_its_sections(tmp_path):
    pin = {"requirements.txt": "bitsandbytes==0.49.1\n"}
    # No FSDP section switched on, or Oumi's own trainer (which wraps the model itself): no accelerate FSDP job.
    for name, text in (("no-fsdp", OUMI.replace("enable_fsdp: true", "enable_fsdp: false")),
                       ("oumi-trainer", OUMI.replace("TRL_SFT", "OUMI"))):
        root = _project(tmp_path / name, {"job.yaml": text, **pin})
        assert not [f for f in _check(root / "job.yaml") if STATE_FSDP1 in f["message"]], name
    # No checkpoints (save_steps 0, no save_epoch): the optimizer state is never gathered.
    root = _project(tmp_path / "no-save", {"job.yaml": OUMI.replace("save_steps: 200", "save_steps: 0"), **pin})
    assert not [f for f in _check(root / "job.yaml") if STATE_FSDP1 in f["message"]]
    # Oumi's default saves every 100 steps: certain without a save key.
    root = _project(tmp_path / "default", {"job.yaml": OUMI.replace("  save_steps: 200\n", ""), **pin})
    found = [f for f in _check(root / "job.yaml") if STATE_FSDP1 in f["message"] and f["filename"].endswith("job.yaml")]
    assert found and found[0]["severity"] == "error"
    # CPU offload from `fsdp.cpu_offload`: the 8-bit step on CPU shards.
    root = _project(tmp_path / "offload", {"job.yaml": OUMI + "  cpu_offload: true\n", **pin})
    assert [f for f in _check(root / "job.yaml") if CPU_OFFLOAD in f["message"]]
    # A config of another program with `model:` and `training:` sections but no model_name is not Oumi's.
    other = OUMI.replace("model_name:", "name:")
    root = _project(tmp_path / "other", {"job.yaml": other, **pin})
    assert not _check(root / "job.yaml")


def test_an_accelerate_config_linted_alone_uses_its_projects_versions(tmp_path):
    # The config's own lint and a script launched with it read the same pins: no "no known version" warning
    # on one path while the other knows the release.
    adv = "accelerate-fsdp2-full-state-dict-refused"
    cfg = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_state_dict_type: FULL_STATE_DICT\n"
    for pin, severity in (("accelerate==1.6.0\n", "error"), ("accelerate>=1.3.0,<=1.11.0\n", "warning"),
                          ("accelerate==1.7.0\n", None)):
        root = _project(tmp_path / pin.strip().replace("=", "").replace(",", "-").replace("<", "").replace(">", ""),
                        {"configs/fsdp.yaml": cfg, "requirements.txt": pin})
        found = [f for f in _check(root / "configs" / "fsdp.yaml") if adv in f["message"]]
        assert [f["severity"] for f in found if f["filename"].endswith("fsdp.yaml")] == ([severity] if severity else []), (pin, found)
        assert not [f for f in found if "no known version" in f["message"]]
