"""Inputs for the project-view scenarios: a whole real repository, and a generated 1,000-file project.

Nothing is downloaded or committed: the repository is a directory the user provides (`--repo PATH`,
e.g. a `git archive` of a public training repository extracted to a temporary directory); the
1,000-file project is written to the harness's temporary directory.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Tree:
    root: Path
    files: int
    lines: int
    target: Path | None = None  # the one file a pre-commit run would pass


def count(root: Path) -> tuple[int, int]:
    files = lines = 0
    for p in root.rglob("*.py"):
        files += 1
        try:
            lines += p.read_bytes().count(b"\n")
        except OSError:
            pass
    return files, lines


def repository(src: Path, dest: Path) -> Tree:
    """A copy of the repository's Python files (so the cache directory lands in the copy, not in it)."""
    if dest.exists():
        shutil.rmtree(dest)
    for p in src.rglob("*.py"):
        rel = p.relative_to(src)
        if any(part.startswith(".") for part in rel.parts):
            continue
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, out)
    (dest / "pyproject.toml").write_text("[project]\nname = 'bench-repo'\n")
    return Tree(dest, *count(dest))


_MODULE = '''"""Generated module {i} of a synthetic training project."""

import logging
import os

import torch
{imports}

logger = logging.getLogger(__name__)
DEFAULTS_{i} = {{"lr": 1e-4, "steps": {i}, "name": "mod_{i:04d}"}}


def read_config_{i}(path):
    """Plain Python: no model in sight."""
    out = dict(DEFAULTS_{i})
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                key, _, value = line.partition("=")
                out[key.strip()] = value.strip()
    return out


def log_metrics_{i}(step, loss):
    if step % 10 == 0:
        logger.info("step %d loss %.4f", step, loss)
    return {{"step": step, "loss": float(loss)}}


def batches_{i}(data, size):
    for start in range(0, len(data), size):
        yield data[start:start + size]
{model_code}
'''

_MODEL_CODE = '''

def build_{i}(name):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    return model


def wrap_{i}(model, policy):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
'''

_TRAIN = '''"""The one changed file: a training script over the generated project."""

import torch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from proj.mod_0010 import build_10
from proj.mod_0020 import wrap_20
{imports}


def main(path):
    config = read_config_3(path)
    model = build_10(config["name"])
    model = wrap_20(model, ModuleWrapPolicy({{LlamaDecoderLayer}}))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config["lr"])
    for step, batch in enumerate(batches_5(list(range(1000)), 8)):
        loss = model(batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        log_metrics_7(step, loss)


if __name__ == "__main__":
    main("config.txt")
'''


def synthetic(dest: Path, n: int = 1000) -> Tree:
    """`n` files: `proj/mod_XXXX.py` (each imports two earlier modules; every tenth also loads, LoRA-injects
    and wraps a model) and `train.py`, which calls into a few of them."""
    if dest.exists():
        shutil.rmtree(dest)
    pkg = dest / "proj"
    pkg.mkdir(parents=True)
    (dest / "pyproject.toml").write_text("[project]\nname = 'synthetic'\n")
    (pkg / "__init__.py").write_text("")
    for i in range(n - 2):
        deps = sorted({j for j in (i // 2, i - 1) if 0 <= j < i})
        imports = "\n".join(f"from proj.mod_{j:04d} import log_metrics_{j}" for j in deps)
        code = _MODULE.format(i=i, imports=imports, model_code=_MODEL_CODE.format(i=i) if i % 10 == 0 else "")
        (pkg / f"mod_{i:04d}.py").write_text(code)
    imports = "\n".join(f"from proj.mod_{j:04d} import {f}_{j}" for j, f in
                        ((3, "read_config"), (5, "batches"), (7, "log_metrics")))
    train = dest / "train.py"
    train.write_text(_TRAIN.format(imports=imports))
    files, lines = count(dest)
    return Tree(dest, files, lines, train)
