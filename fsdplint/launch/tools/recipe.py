"""trl / alignment-handbook recipes (one YAML for trl's ModelConfig, ScriptArguments and SFTConfig),
as the model side's input (`fsdplint model recipe.yaml --config-json config.json`).

Read from trl (trainer/model_config.py, trainer/utils.py `get_quantization_config`, main branch and
v0.26.0): `load_in_4bit` builds BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype,
bnb_4bit_quant_storage=<recipe's bnb_4bit_quant_storage, default None: uint8>); `use_peft` with
`lora_r`, `lora_alpha`, `lora_target_modules`; FSDP from the SFTConfig `fsdp`/`fsdp_config` keys.

Not linted on its own: the script that reads a recipe may build the quantization config itself, so
the recipe alone does not say what runs (the script's side is the argument analysis's business).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from fsdplint.launch.tools.job import Job, Quant, dtype_name

_MODEL_KEYS = frozenset({"use_peft", "load_in_4bit", "load_in_8bit", "lora_target_modules", "torch_dtype", "dtype",
                         "lora_r", "bnb_4bit_quant_storage"})
_TRAIN_KEYS = frozenset({"output_dir", "learning_rate", "per_device_train_batch_size", "num_train_epochs",
                         "dataset_name", "dataset_mixer", "gradient_checkpointing", "max_seq_length", "max_length",
                         "bf16", "fsdp", "fsdp_config"})


def looks_like(keys: set) -> bool:
    return ("model_name_or_path" in keys and bool(keys & _MODEL_KEYS) and bool(keys & _TRAIN_KEYS)
            and "stage" not in keys and "finetuning_type" not in keys)


def fill(job: Job, versions: dict, path: Optional[Path]) -> None:
    from fsdplint.launch.tools.llamafactory import _fill_fsdp

    job.model = job.get("model_name_or_path")
    config_dir = path.parent if path is not None else None
    job.model_ref = (job.value("model_name_or_path"), None, config_dir)
    if job.value("use_peft") is True:
        job.adapter = job.get("use_peft")
        targets = job.value("lora_target_modules")
        if isinstance(targets, str) and targets != "all-linear":
            targets = [targets]
        if isinstance(targets, list) and all(isinstance(t, str) for t in targets):
            job.lora_targets, job.targets_setting = list(targets), job.get("lora_target_modules")
    _fill_fsdp(job, versions)
    dtype = dtype_name(job.value("dtype", job.value("torch_dtype")))
    if job.value("load_in_4bit") is True:
        storage = dtype_name(job.value("bnb_4bit_quant_storage"))
        job.quant = Quant(4, job.get("load_in_4bit"), storage, job.get("bnb_4bit_quant_storage"), dtype)
    elif job.value("load_in_8bit") is True:
        job.quant = Quant(8, job.get("load_in_8bit"), None, None, dtype)
