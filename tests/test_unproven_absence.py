"""A rule that claims something never happens ("the CUDA device is never set") is an error only when the
analysis read every call that could do it: the call is followed into the project's code (a class built after
the init, a package `__init__` re-export, a library's own repository linted), and a call it could not read
that may do it turns the error into a warning that names that call."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint.cli import main

DEVICE_HELPERS = """\
import os
import torch


def _setup_cuda_device(device):
    torch.cuda.set_device(device)
    return device


def get_device(device=None):
    if device is None:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return _setup_cuda_device(device)
"""

# The recipe class sets the device in its constructor, built after the process group (torchtune's shape).
RECIPE_CLASS = """\
import torch
from torch.distributed import init_process_group
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from {pkg} import utils


class Recipe:
    def __init__(self, cfg):
        self._device = utils.get_device(device=cfg.device)

    def setup(self, model):
        self.model = FSDP(model, device_id=self._device)


def main(cfg, model):
    init_process_group(backend="nccl")
    recipe = Recipe(cfg=cfg)
    recipe.setup(model)
"""

# The device is set in a method the script calls on the object it built, through a helper of another module.
RECIPE_METHOD = """\
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from trainkit.devices import get_device


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg

    def prepare(self):
        self.device = get_device()

    def shard(self, model):
        fully_shard(model)


def run(cfg, model):
    dist.init_process_group("nccl")
    t = Trainer(cfg)
    t.prepare()
    t.shard(model)
"""

UNREAD_HELPER = """\
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from cluster_tools import init_distributed_mode


def main(args, model):
    dist.init_process_group("nccl")
    init_distributed_mode(args)
    model = FSDP(model)
"""

NOTHING_UNREAD = """\
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from model_zoo import build_model


def main():
    dist.init_process_group("nccl")
    model = FSDP(build_model())
"""


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def _lint(path: Path) -> list[dict]:
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--output-format", "json",
                                  "--target-version", "torch=2.6", str(path)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return [f for f in json.loads(r.stdout) if f["code"] == "FSDP014"]


def test_class_built_after_init_sets_device_through_package_reexport(tmp_path):
    root = _write(tmp_path / "repo", {
        "pyproject.toml": "[project]\nname = 'mytune'\n",
        "mytune/__init__.py": "",
        "mytune/utils/__init__.py": "from ._device import get_device\n\n__all__ = ['get_device']\n",
        "mytune/utils/_device.py": DEVICE_HELPERS,
        "recipes/finetune.py": RECIPE_CLASS.format(pkg="mytune"),
    })
    assert _lint(root) == []


def test_library_own_repository_names_its_unread_package_call(tmp_path):
    # Linting torchtune itself: its package stays a library, so the device helper is named, not followed.
    root = _write(tmp_path / "torchtune-repo", {
        "pyproject.toml": "[project]\nname = 'torchtune'\n",
        "torchtune/__init__.py": "",
        "torchtune/utils/__init__.py": "from ._device import get_device\n",
        "torchtune/utils/_device.py": DEVICE_HELPERS,
        "recipes/lora_finetune_distributed.py": RECIPE_CLASS.format(pkg="torchtune"),
    })
    [f] = _lint(root)
    assert f["severity"] == "warning" and "utils.get_device()" in f["message"]


def test_method_of_built_object_calls_helper_one_module_away(tmp_path):
    root = _write(tmp_path / "repo", {
        "pyproject.toml": "[project]\nname = 'trainkit'\n",
        "trainkit/__init__.py": "",
        "trainkit/devices.py": DEVICE_HELPERS,
        "train.py": RECIPE_METHOD,
    })
    assert _lint(root) == []


def test_unread_library_helper_that_may_set_device_is_a_warning_naming_it(tmp_path):
    # The same recipe without the package that sets the device: its code cannot be read.
    root = _write(tmp_path / "repo", {
        "pyproject.toml": "[project]\nname = 'recipes'\n",
        "recipes/finetune.py": RECIPE_CLASS.format(pkg="torchtune"),
        "launch/main.py": UNREAD_HELPER,
    })
    found = {Path(f["filename"]).name: f for f in _lint(root)}
    assert set(found) == {"finetune.py", "main.py"}
    assert all(f["severity"] == "warning" for f in found.values())
    assert "utils.get_device()" in found["finetune.py"]["message"]
    assert "init_distributed_mode()" in found["main.py"]["message"]


def test_no_call_that_could_set_device_stays_an_error(tmp_path):
    root = _write(tmp_path / "repo", {"pyproject.toml": "[project]\nname = 'x'\n", "train.py": NOTHING_UNREAD})
    [f] = _lint(root)
    assert f["severity"] == "error"


# The prepared model goes to a helper of an unresolvable module that may cast it back to bf16 (oumi's shape:
# a `coerce_model_to_dtype(model, dtype)` the work bounds leave unread).
KBIT_THEN_UNREAD_CAST = """\
import torch
from peft import get_peft_model, prepare_model_for_kbit_training
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from model_utils import coerce_model_to_dtype


def main(model, cfg):
    model = prepare_model_for_kbit_training(model)
    model = get_peft_model(model, cfg)
    coerce_model_to_dtype(model, torch.bfloat16)
    model = FSDP(model, use_orig_params=False)
"""

# An unread helper that never receives the model cannot cast it back: still an error.
KBIT_UNREAD_ELSEWHERE = """\
from peft import get_peft_model, prepare_model_for_kbit_training
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from model_utils import cast_inputs_to_dtype


def main(model, cfg, batch):
    model = prepare_model_for_kbit_training(model)
    model = get_peft_model(model, cfg)
    batch = cast_inputs_to_dtype(batch)
    model = FSDP(model, use_orig_params=False)
"""


def _lint_code(path: Path, code: str) -> list[dict]:
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--output-format", "json",
                                  "--target-version", "torch=2.6", "--target-version", "peft=0.21.2", str(path)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return [f for f in json.loads(r.stdout) if f["code"] == code]


def test_kbit_prep_then_unread_cast_of_the_model_is_a_warning(tmp_path):
    root = _write(tmp_path / "repo", {"pyproject.toml": "[project]\nname = 'x'\n", "train.py": KBIT_THEN_UNREAD_CAST})
    [f] = _lint_code(root, "FSDP104")
    assert f["severity"] == "warning"
    assert "coerce_model_to_dtype()" in f["message"]


def test_kbit_prep_with_unread_call_not_taking_the_model_stays_an_error(tmp_path):
    root = _write(tmp_path / "repo", {"pyproject.toml": "[project]\nname = 'x'\n", "train.py": KBIT_UNREAD_ELSEWHERE})
    [f] = _lint_code(root, "FSDP104")
    assert f["severity"] == "error"


def test_project_helper_left_out_by_the_work_bounds_is_named(tmp_path):
    # Seven helper modules that take the model: the bounds on the work per file read six; the cast back
    # to bf16 lives in the seventh, so the fp32 upcast is not proven to reach FSDP.
    files = {"pyproject.toml": "[project]\nname = 'x'\n"}
    calls = []
    for i in range(6):
        files[f"step{i}.py"] = f"def step{i}(model):\n    model.gradient_checkpointing_enable()\n    return model\n"
        calls.append(f"from step{i} import step{i}")
    files["recast.py"] = ("import torch\n\n\ndef recast(model):\n    for m in model.modules():\n"
                          "        m.to(torch.bfloat16)\n    model.gradient_checkpointing_enable()\n")
    body = "\n".join(f"    model = step{i}(model)" for i in range(6))
    files["train.py"] = "\n".join([
        "from peft import get_peft_model, prepare_model_for_kbit_training",
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP",
        *calls, "from recast import recast", "", "",
        "def main(model, cfg):",
        "    model = prepare_model_for_kbit_training(model)",
        body, "    recast(model)", "    model = FSDP(get_peft_model(model, cfg), use_orig_params=False)", ""])
    root = _write(tmp_path / "repo", files)
    [f] = [f for f in _lint_code(root, "FSDP104") if f["filename"].endswith("train.py")]
    assert f["severity"] == "warning"
    assert "recast()" in f["message"] and "bounds" in f["message"]


OPTIMIZER_THEN_WRAP = """\
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from trainkit import {helper}


def main(model, cfg):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model = FSDP(model, use_orig_params=False)
    optimizer = {helper}(model, cfg)
    return model, optimizer
"""


def test_optimizer_before_wrap_then_unread_rebuild_is_a_warning(tmp_path):
    root = _write(tmp_path / "repo", {"pyproject.toml": "[project]\nname = 'x'\n",
                                      "train.py": OPTIMIZER_THEN_WRAP.format(helper="build_optimizer")})
    [f] = _lint_code(root, "FSDP102")
    assert f["severity"] == "warning" and "build_optimizer()" in f["message"]


def test_optimizer_before_wrap_then_unrelated_unread_call_stays_an_error(tmp_path):
    root = _write(tmp_path / "repo", {"pyproject.toml": "[project]\nname = 'x'\n",
                                      "train.py": OPTIMIZER_THEN_WRAP.format(helper="log_summary")})
    [f] = _lint_code(root, "FSDP102")
    assert f["severity"] == "error"


def test_kbit_prep_on_one_side_of_a_run_time_choice_is_a_warning(tmp_path):
    # `if peft_params.q_lora:` read from a job config at run time: only a QLoRA job prepares the model.
    root = _write(tmp_path / "repo", {"pyproject.toml": "[project]\nname = 'x'\n", "train.py": """\
from peft import get_peft_model, prepare_model_for_kbit_training
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def build(base_model, peft_params, cfg):
    if peft_params.q_lora:
        model = prepare_model_for_kbit_training(model=base_model)
    else:
        model = base_model
    return FSDP(get_peft_model(model, cfg), use_orig_params=False)
"""})
    [f] = _lint_code(root, "FSDP104")
    assert f["severity"] == "warning" and "peft_params.q_lora" in f["message"]
