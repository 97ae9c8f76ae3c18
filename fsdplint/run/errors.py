"""An exception the job raised → the rule that explains it, at the user's own source line.

The table is data: a text torch/peft/transformers raise, and the rule code. An exception no row
matches is still reported (FSDP904, job-raised) with its text and the user's frame.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from typing import Optional

# (regular expression on the exception text, rule code). First match wins.
ERROR_RULES = (
    (r"Cannot flatten integer dtype tensors", "FSDP202"),
    (r"FlatParameter requires uniform dtype", "FSDP202"),
    (r"Must flatten tensors with uniform dtype but got .*(u?int8|uint8)", "FSDP202"),
    (r"Must flatten tensors with uniform `?requires_grad`?", "FSDP004"),
    (r"has both parameters with requires_grad=True and False", "FSDP004"),
    (r"Must flatten tensors with uniform dtype", "FSDP005"),
    (r"uniform original parameter dtype", "FSDP005"),
    (r"uniform reduce dtype", "FSDP005"),
    (r"element 0 of tensors does not require grad", "FSDP105"),
    (r"Target modules? .* not found in the base model", "FSDP113"),
    (r"floating point dtype can require gradients", "FSDP201"),
    (r"shared with a parameter already managed", "FSDP006"),
    (r"ignored_params", "FSDP001"),
    # accelerate's refusals of rank-0-only loading without the broadcast, and FSDP1's of a CPU module
    (r"set `--fsdp_sync_module_states` to `True`|Set the `sync_module_states` flag to `True`", "FSDP011"),
    (r"CPU parameters or buffers when `sync_module_states=True`", "FSDP011"),
    (r"FSDP parameters should be materialized from meta device", None),  # the dry run's own limit
)
JOB_RAISED = "FSDP904"


def rule_for(text: str) -> Optional[str]:
    for pattern, code in ERROR_RULES:
        if re.search(pattern, text):
            return code
    return JOB_RAISED


def _library_dirs() -> tuple:
    import sysconfig

    dirs = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fsdplint itself
    return tuple(os.path.abspath(d) + os.sep for d in dirs if d)


def user_frame(tb, user_root: str) -> Optional[tuple[str, int, str]]:
    """The deepest frame in the user's files: (path, line, source text)."""
    return deepest_user_frame(traceback.extract_tb(tb), user_root)


def deepest_user_frame(frames, user_root: str) -> Optional[tuple[str, int, str]]:
    """Of `frames` (traceback.FrameSummary, outermost first), the deepest in the user's files."""
    libs = _library_dirs()
    root = os.path.abspath(user_root) + os.sep
    best = None
    for fs in frames:
        path = os.path.abspath(fs.filename)
        if path.startswith(libs) or fs.filename.startswith("<"):
            continue
        if path.startswith(root) or not any(path.startswith(l) for l in libs):
            best = (path, fs.lineno or 1, (fs.line or "").strip())
    return best


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = next((l.strip() for l in text if l.strip()), "")
    return f"{type(e).__name__}: {first}" if first else type(e).__name__
