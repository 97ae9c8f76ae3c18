"""One libcst parse per module and run: with `-j 1` and `-j N` alike, and for a script linted once more per
launch and argument set. Counted with `FSDPLINT_PARSE_LOG` (fsdplint/parsing.py), findings compared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Modules of a project, each a function another module calls into (a chain: train -> setup -> wrap -> load).
LOAD = """
    import torch
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model


    def load_model_{i}(name):
        model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
        return get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
"""
WRAP = """
    from torch.distributed.fsdp import fully_shard
    from pkg.load_{i} import load_model_{i}


    def wrapped_{i}(name):
        model = load_model_{i}(name)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
"""
TRAIN = """
    import argparse

    import torch
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    {imports}

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="m")
    parser.add_argument("--late-lora", action="store_true")
    args = parser.parse_args()
    models = [{calls}]
    model = AutoModelForCausalLM.from_pretrained(args.model)
    fully_shard(model)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["v_proj"]))
"""


def _project(tmp: Path, apps: int = 2, per_app: int = 3) -> Path:
    """`apps` training scripts, each calling into `per_app` chains of modules of its own."""
    root = tmp / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'proj'\n")
    (root / "pkg" / "__init__.py").write_text("")
    for app in range(apps):
        chains = range(app * per_app, (app + 1) * per_app)
        for i in chains:
            (root / "pkg" / f"load_{i}.py").write_text(textwrap.dedent(LOAD.format(i=i)))
            (root / "pkg" / f"wrap_{i}.py").write_text(textwrap.dedent(WRAP.format(i=i)))
        imports = "\n".join(f"from pkg.wrap_{i} import wrapped_{i}" for i in chains)
        calls = ", ".join(f"wrapped_{i}(args.model)" for i in chains)
        (root / f"train_{app}.py").write_text(textwrap.dedent(TRAIN).format(imports=imports, calls=calls))
    return root


def _lint(root: Path, log: Path, *flags: str) -> tuple[list, Counter]:
    env = {**os.environ, "FSDPLINT_PARSE_LOG": str(log),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-m", "fsdplint", "check", "--isolated", "--exit-zero", "--no-cache",
                        "--output-format", "json", *flags], cwd=root, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    parses = Counter(line.split("\t", 1)[1] for line in log.read_text().splitlines() if not line.endswith("\t-"))
    return json.loads(p.stdout), parses


def test_each_module_parsed_once_with_one_and_two_jobs(tmp_path):
    root = _project(tmp_path)
    one, parses_one = _lint(root, tmp_path / "one.log", ".", "-j", "1")
    two, parses_two = _lint(root, tmp_path / "two.log", ".", "-j", "2")
    assert one == two
    assert {f["code"] for f in one} >= {"FSDP101"}  # LoRA injected after fully_shard in train.py
    linted = {str(p.resolve()) for p in root.rglob("*.py") if p.read_text()}
    # Every module with code is parsed, each once: the modules a training script reaches are not parsed
    # again (in part by the worker that reaches them, then whole for their own lint by another).
    assert set(parses_one) >= linted - {str((root / "pkg" / "__init__.py").resolve())}
    assert max(parses_one.values()) == 1, parses_one
    assert max(parses_two.values()) == 1, parses_two


def test_a_script_linted_per_argument_set_is_parsed_once(tmp_path):
    root = _project(tmp_path, apps=1, per_app=1)
    findings, parses = _lint(root, tmp_path / "log", "--no-project", "train_0.py")
    assert "FSDP101" in {f["code"] for f in findings}
    assert parses == {str((root / "train_0.py").resolve()): 1}


# A module every chain calls into (two of its functions), so that both workers of `-j 2` reach it.
COMMON = """
    import torch
    from torch.distributed.fsdp import fully_shard


    def shard_layers(model):
        for layer in model.model.layers:
            fully_shard(layer)
        return model


    def cast(model):
        fully_shard(model)
        return model.to(torch.bfloat16)
"""
SHARED_WRAP = """
    from pkg.common import cast, shard_layers
    from pkg.load_{i} import load_model_{i}


    def wrapped_{i}(name):
        model = shard_layers(load_model_{i}(name))
        return cast(model)
"""


def test_a_module_both_workers_reach_is_parsed_whole_in_each_at_most(tmp_path):
    root = _project(tmp_path)
    (root / "pkg" / "common.py").write_text(textwrap.dedent(COMMON))
    for i in range(6):
        (root / "pkg" / f"wrap_{i}.py").write_text(textwrap.dedent(SHARED_WRAP.format(i=i)))
    one, parses_one = _lint(root, tmp_path / "one.log", ".", "-j", "1")
    two, parses_two = _lint(root, tmp_path / "two.log", ".", "-j", "2")
    assert one == two
    assert {f["code"] for f in one} >= {"FSDP101"}
    assert max(parses_one.values()) == 1, parses_one
    # A worker reaching a module that the other worker lints parses it whole, once, for every function its
    # files call there (not one part, then the whole when a second function is wanted); a module it lints
    # itself is parsed once. No linted module is parsed in part, as with one job.
    kinds = Counter(line.split("\t", 1)[0] for line in (tmp_path / "two.log").read_text().splitlines())
    assert kinds["part"] == 0, (tmp_path / "two.log").read_text()
    assert max(parses_two.values()) <= 2, parses_two
    assert sum(parses_two.values()) <= len(parses_one) + 1, parses_two
