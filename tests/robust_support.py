"""Throwaway rules for robustness tests, discovered by the real registry like any file in `rules/`."""

from __future__ import annotations

import contextlib
import shutil
import sys
import textwrap
from pathlib import Path

from fsdplint import registry

# LoRA injected after FSDP1 wrapping: FSDP101, and nothing else, on every target version.
BUGGY = """\
import torch
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

def main(model):
    model = FSDP(model, use_orig_params=True)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    return model
"""

HEADER = """\
import libcst as cst

from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import FixSpec, Replace
from fsdplint.rule import Rule

"""


@contextlib.contextmanager
def extra_rule(tmp_path: Path, stem: str, body: str):
    """Make `registry.all_rules()` find one more rule file `<stem>.py` next to the real ones.

    The real rule files are linked into a temporary rules directory (they keep their module
    names, so nothing is loaded twice) and the registry's caches are cleared on entry and exit.
    """
    rules = tmp_path / "rules"
    rules.mkdir()
    for p in registry.rules_dir().glob("fsdp*.py"):
        try:
            (rules / p.name).symlink_to(p)
        except OSError:  # no symlinks on this platform
            shutil.copy(p, rules / p.name)
    (rules / f"{stem}.py").write_text(HEADER + textwrap.dedent(body))
    modname = f"fsdplint.rules.{stem}"
    original = registry.rules_dir
    registry.rules_dir = lambda: rules
    registry.all_rules.cache_clear()
    registry.rules_by_code.cache_clear()
    try:
        registry.all_rules()
        yield
    finally:
        registry.rules_dir = original
        sys.modules.pop(modname, None)
        registry.all_rules.cache_clear()
        registry.rules_by_code.cache_clear()
