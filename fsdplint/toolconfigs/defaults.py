"""Defaults and tool behaviour that changed across versions, as data (with where each was read).

Each entry says from which version of which distribution a behaviour holds. Checks ask
`since(name, version)`: True / False when the version is known, None when it is not — and an
unknown version turns an error into a warning that says what to declare.

Tool versions (axolotl, LLaMA-Factory) come from the project's declared requirements (lock files,
pyproject.toml, requirements*.txt, setup.cfg/setup.py, as for the libraries) or the installed
distribution's metadata, never from importing it, and never from a guess: unknown stays unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from packaging.version import Version

from fsdplint.versions import TargetVersion, parse_version


@dataclass(frozen=True)
class Behaviour:
    package: str
    since: str  # first version with the behaviour
    what: str  # what the tool/library does from `since` on
    before: str  # what it did before
    source: str  # where it was read


BEHAVIOUR: dict[str, Behaviour] = {
    # -- transformers / accelerate defaults ---------------------------------------------------
    "trainer_fsdp2_default": Behaviour(
        "transformers", "5.10.0",
        "TrainingArguments(fsdp=...) without fsdp_config version runs FSDP2",
        "TrainingArguments(fsdp=...) without a version ran FSDP1",
        "transformers#45640 (\"Default to FSDP2\"); training_args.py `fsdp_config.get(\"version\", 2)` in 5.24, "
        "`.get(\"version\", 1)` before; axolotl v0.18.0 utils/schemas/validation.py (\"transformers >= 5.10 "
        "defaults a missing version to FSDP2\")"),
    # -- axolotl ---------------------------------------------------------------------------------
    "axolotl_qlora_fsdp_storage": Behaviour(
        "axolotl", "0.5.0",
        "`adapter: qlora` + `load_in_4bit` builds BitsAndBytesConfig(bnb_4bit_quant_storage=torch.bfloat16)",
        "no bnb_4bit_quant_storage (uint8)",
        "axolotl v0.5.0 src/axolotl/utils/models.py, v0.18.0 src/axolotl/loaders/model.py (set_quantization_config)"),
    "axolotl_lora_4bit_ignored": Behaviour(
        "axolotl", "0.13.0",
        "`adapter: lora` + `load_in_4bit` builds no 4-bit config (only `adapter: qlora` quantizes to 4 bits)",
        "`adapter: lora` + `load_in_4bit` passed load_in_4bit=True to from_pretrained (uint8 storage)",
        "axolotl v0.12.0 loaders/model.py (`model_kwargs[\"load_in_4bit\"] = cfg.load_in_4bit`), v0.13.0 (removed)"),
    "axolotl_fsdp2_4bit_patch": Behaviour(
        "axolotl", "0.12.0",
        "with fsdp_version 2 and `adapter: qlora`, axolotl patches FSDP2's FSDPParam to keep Params4bit",
        "no FSDP2 support for Params4bit",
        "axolotl#2992; v0.12.0 src/axolotl/monkeypatch/fsdp2_qlora.py, loaders/patch_manager.py"),
    "axolotl_fsdp2_8bit_patch": Behaviour(
        "axolotl", "0.15.0",
        "with fsdp_version 2 and load_in_8bit, axolotl patches FSDP2 to keep Int8Params",
        "no FSDP2 support for Int8Params",
        "axolotl v0.15.0 loaders/patch_manager.py `_apply_fsdp2_bnb_patches` (load_in_4bit or load_in_8bit)"),
    "axolotl_fsdp_device_map": Behaviour(
        "axolotl", "0.12.0",
        "under FSDP axolotl drops the config's device_map (\"FSDP requires control over device placement\")",
        "the config's device_map was passed to from_pretrained",
        "axolotl v0.12.0 loaders/model.py `_set_device_map_config`"),
    # axolotl's own fsdp_version default is 1 in every version: v0.18.0 pins it
    # (validation.py check_fsdp_version_in_fsdp_config); earlier ones left it to accelerate, whose
    # plugin default is 1, with the transformers pins of their time (< 5.10).
    # -- LLaMA-Factory ---------------------------------------------------------------------------
    "llamafactory_fsdp_bnb_check": Behaviour(
        "llamafactory", "0.8.0",
        "under FSDP LLaMA-Factory requires transformers>=4.39.0 and bitsandbytes>=0.43.0 itself (ImportError)",
        "only under DeepSpeed ZeRO-3; under FSDP an older transformers/bitsandbytes silently keeps uint8 storage",
        "LLaMA-Factory v0.6.0 src/llmtuner/model/patcher.py, v0.8.0 src/llamafactory/model/model_utils/quantization.py"),
    "llamafactory_fsdp_8bit_refused": Behaviour(
        "llamafactory", "0.8.2",
        "8-bit under FSDP raises \"Only 4-bit quantized model can use fsdp+qlora\"",
        "8-bit under FSDP reached FSDP's flattening",
        "LLaMA-Factory commit 60d9896a7 (v0.8.2) model_utils/quantization.py"),
}

# FSDP1 `use_orig_params` when the launch config leaves it out, by what builds the FSDP1 wrap.
USE_ORIG_PARAMS_DEFAULT: dict[str, tuple[bool, str]] = {
    "accelerate": (False, "accelerate's FullyShardedDataParallelPlugin reads FSDP_USE_ORIG_PARAMS, default "
                          "\"False\" (accelerate 1.15 utils/dataclasses.py)"),
    "trainer": (True, "the HF Trainer passes fsdp_config use_orig_params, default \"true\" (transformers "
                      "training_args.py), to accelerate's plugin"),
    "lightning": (True, "Lightning's FSDPStrategy sets use_orig_params=True on torch >= 2.0 "
                        "(fabric/strategies/fsdp.py, pytorch/strategies/fsdp.py)"),
}


def use_orig_params_default(builder: str) -> bool:
    return USE_ORIG_PARAMS_DEFAULT[builder][0]


# The quant storage LLaMA-Factory sets (`bnb_4bit_quant_storage=model_args.compute_dtype`, v0.6.0 on) is a
# keyword that transformers and bitsandbytes know only from these versions (older ones drop it silently).
QUANT_STORAGE_NEEDS = {"transformers": "4.39.0", "bitsandbytes": "0.43.0"}

TOOL_PACKAGES = ("axolotl", "llamafactory")
_ALIASES = {"llamafactory": ("llamafactory", "llmtuner")}


def since(name: str, version: Optional[TargetVersion]) -> Optional[bool]:
    """Does behaviour `name` hold at `version`? None when the version is unknown."""
    if version is None:
        return None
    return version.version >= Version(BEHAVIOUR[name].since)


def known(tv: Optional[TargetVersion]) -> bool:
    """A library version that was declared or installed, not the catalog's fallback."""
    return tv is not None and not tv.source.startswith("default") and "no lower bound" not in tv.source


def trainer_fsdp_version(transformers: Optional[TargetVersion]) -> tuple[int, str]:
    """The FSDP version TrainingArguments(fsdp=...) means when fsdp_config gives none."""
    b = BEHAVIOUR["trainer_fsdp2_default"]
    if transformers is not None and transformers.version >= Version(b.since):
        return 2, f"transformers >= {b.since} defaults TrainingArguments(fsdp=...) to FSDP2 ({transformers.describe()})"
    return 1, "TrainingArguments(fsdp=...) without a version is FSDP1 before transformers 5.10"


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
                return TargetVersion(package, hit[0], hit[1])
    if use_installed:
        for name in names:
            v = versions._installed(name)
            if v is not None:
                return TargetVersion(package, Version(f"{v.major}.{v.minor}.{v.micro}"), "installed")
    return None
