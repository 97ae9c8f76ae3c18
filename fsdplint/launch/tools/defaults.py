"""Defaults and tool behaviour that changed across versions, as data (with where each was read).

Each entry says from which version of which distribution a behaviour holds. Checks ask
`since(name, version)` (over the shared table in fsdplint/behaviour.py): True / False when the version is known, None when it is not — and an
unknown version turns an error into a warning that says what to declare.

Tool versions (axolotl, LLaMA-Factory) come from the project's declared requirements (lock files,
pyproject.toml, requirements*.txt, setup.cfg/setup.py, as for the libraries) or the installed
distribution's metadata, never from importing it, and never from a guess: unknown stays unknown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional

from packaging.version import Version

from fsdplint.apis import BNB_QUANT_STORAGE_SINCE
from fsdplint.behaviour import BEHAVIOURS as BEHAVIOUR
from fsdplint.behaviour import holds, unverified
from fsdplint.versions import TargetVersion, parse_version

# axolotl's own fsdp_version default is 1 in every version: v0.18.0 pins it
# (validation.py check_fsdp_version_in_fsdp_config); earlier ones left it to accelerate, whose
# plugin default is 1, with the transformers pins of their time (< 5.10).



# FSDP1 `use_orig_params` when the launch config leaves it out, by what builds the FSDP1 wrap.
USE_ORIG_PARAMS_DEFAULT: dict[str, tuple[bool, str]] = {
    "accelerate": (False, "accelerate's FullyShardedDataParallelPlugin reads FSDP_USE_ORIG_PARAMS, default "
                          "\"False\" (accelerate 1.15 utils/dataclasses.py)"),
    "trainer": (True, "the HF Trainer passes fsdp_config use_orig_params, default \"true\" (transformers "
                      "training_args.py), to accelerate's plugin"),
    "lightning": (True, "Lightning >= 2.1's FSDPStrategy sets use_orig_params=True on torch >= 2.0 "
                        "(fabric/strategies/fsdp.py, pytorch/strategies/fsdp.py); 2.0 left it False: see "
                        "behaviour.py lightning_fsdp_use_orig_params and analysis/lightning.py"),
}


def use_orig_params_default(builder: str) -> bool:
    return USE_ORIG_PARAMS_DEFAULT[builder][0]


# The quant storage LLaMA-Factory sets (`bnb_4bit_quant_storage=model_args.compute_dtype`, v0.6.0 on) is a
# keyword that transformers and bitsandbytes know only from these versions (older ones drop it silently).
# (bitsandbytes' boundary is the one read at adjacent releases in apis.BOUNDARIES.)
QUANT_STORAGE_NEEDS = {"transformers": "4.39.0", "bitsandbytes": BNB_QUANT_STORAGE_SINCE}

TOOL_PACKAGES = ("axolotl", "llamafactory")
_ALIASES = {"llamafactory": ("llamafactory", "llmtuner")}


def since(name: str, version: Optional[TargetVersion]) -> Optional[bool]:
    """Does behaviour `name` hold at `version`? None when the version is unknown, or when the answer rests
    on a boundary not read at two adjacent releases (behaviour.unverified): the tool's gate is then open
    either way, and its finding a warning."""
    if version is None or unverified(name, version):
        return None
    return holds(name, version)


def known(tv: Optional[TargetVersion]) -> bool:
    """A library version that was declared or installed, not the catalog's fallback."""
    return tv is not None and not tv.source.startswith("default") and "no lower bound" not in tv.source


def trainer_fsdp_version(transformers: Optional[TargetVersion]) -> tuple[int, str]:
    """The FSDP version TrainingArguments(fsdp=...) means when fsdp_config gives none. An unknown
    transformers keeps the FSDP1 meaning of every release before 5.10."""
    b = BEHAVIOUR["training_args_fsdp_default_v2"]
    if transformers is not None and holds(b.key, transformers):
        return 2, f"transformers >= {b.since} defaults TrainingArguments(fsdp=...) to FSDP2 ({transformers.describe()})"
    return 1, f"TrainingArguments(fsdp=...) without a version is FSDP1 before transformers {b.since}"


def tool_version(package: str, path: Optional[Path], explicit: Mapping[str, str] = {},
                 use_installed: bool = True) -> Optional[TargetVersion]:
    """The declared (or installed) version of a training tool; None when neither says."""
    from fsdplint import versions

    if package in explicit:
        v = parse_version(explicit[package])
        if v is not None:
            return TargetVersion(package, v, "--target-version")
    names = _ALIASES.get(package, (package,))
    if path is not None:
        for name in names:
            hit = versions._declared(path.resolve().parent, name)
            if hit is not None and hit[0] is not None:
                return TargetVersion(package, hit[0], hit[1], hit[2])
    if use_installed:
        for name in names:
            v = versions._installed(name)
            if v is not None:
                return TargetVersion(package, Version(f"{v.major}.{v.minor}.{v.micro}"), "installed")
    return None
