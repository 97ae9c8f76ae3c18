"""Oumi training configs (`oumi train -c cfg.yaml`, `torchrun -m oumi.train -c cfg.yaml`).

What Oumi builds, read from its source (src/oumi/core/configs/params/*.py, core/distributed.py, train.py,
at the v0.1 line of late 2024 and at the newest snapshot read, v0.8 and after):
- The config is nested: `model.model_name`, `training.*` (TrainingParams.to_hf() passes `training.optimizer`
  as TrainingArguments' `optim`, `training.gradient_accumulation_steps` as is), `peft.*` and `fsdp.*`.
- `fsdp.enable_fsdp: true` with a transformers/trl trainer (`training.trainer_type` hf, trl_sft, ...; hf is the
  default) sets accelerate's FSDP environment (get_accelerate_env_vars: ACCELERATE_USE_FSDP, FSDP_OFFLOAD_PARAMS
  from `fsdp.cpu_offload`, FSDP_STATE_DICT_TYPE, FSDP_AUTO_WRAP_POLICY, ...) and no FSDP_VERSION: accelerate's
  FSDP1. The `oumi` trainer type wraps the model itself (core/distributed.py), which this reader does not follow.
- `training.save_steps` (default 100) > 0 or `training.save_epoch` makes the Trainer write checkpoints
  (save_strategy "steps" / "epoch", else "no").
- `training.use_peft` with `peft.q_lora` loads the base in `peft.q_lora_bits` (default 4) bits with
  `peft.bnb_4bit_quant_storage` (default uint8). Oumi job files often override that key on the command line
  (`"peft.bnb_4bit_quant_storage=bfloat16"`), which this reader does not see: the quantization is taken only
  when the YAML writes the storage itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from fsdplint.launch.settings import LaunchFacts, Setting
from fsdplint.launch.tools.job import Job, Quant, dtype_name

# The trainer types that hand the model to a transformers/trl Trainer (and so to accelerate's FSDP).
_TRAINERS = {"hf": "Trainer", "trl_sft": "SFTTrainer"}
_HF_TYPES = ("hf", "trl_sft", "trl_dpo", "trl_grpo")
# fsdp.* keys as accelerate's FSDP settings (after accelerate's fsdp_ prefix is dropped).
_FSDP_KEYS = {"sharding_strategy": "sharding_strategy", "cpu_offload": "offload_params",
              "auto_wrap_policy": "auto_wrap_policy", "transformer_layer_cls": "transformer_layer_cls_to_wrap",
              "state_dict_type": "state_dict_type", "use_orig_params": "use_orig_params",
              "sync_module_states": "sync_module_states"}


def looks_like(keys: set, nested: set) -> bool:
    """An Oumi training config: `model:` with `model_name` and a `training:` section."""
    return {"model", "training"} <= keys and "model.model_name" in nested


def _true(s: Optional[Setting]) -> bool:
    v = s.value if s is not None else None
    return v is True or (isinstance(v, str) and v.strip().lower() == "true")


def trainer_type(job: Job) -> str:
    return str(job.value("training.trainer_type", "hf") or "hf").strip().lower()


def trainer_class(job: Job) -> Optional[str]:
    return _TRAINERS.get(trainer_type(job))


def fill(job: Job, versions: dict, path: Optional[Path]) -> None:
    job.model = job.get("model.model_name")
    config_dir = path.parent if path is not None else None
    job.model_ref = (job.value("model.model_name"), None, config_dir)
    if _true(job.get("training.use_peft")):
        job.adapter = Setting("adapter", "lora", job.get("training.use_peft").filename, job.get("training.use_peft").line)
        targets = job.value("peft.lora_target_modules")
        if isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets):
            job.lora_targets = list(targets)
            job.targets_setting = job.get("peft.lora_target_modules")
        q = job.get("peft.q_lora")
        storage = job.get("peft.bnb_4bit_quant_storage")
        if _true(q) and storage is not None:
            try:
                bits = int(job.value("peft.q_lora_bits", 4))
            except (TypeError, ValueError):
                bits = 4
            if bits in (4, 8):
                name = dtype_name(storage.value) or str(storage.value).strip().lower().removeprefix("torch.")
                job.quant = Quant(bits, q, name if bits == 4 and name != "uint8" else None, storage,
                                  dtype_name(job.value("model.torch_dtype_str")))
    if _true(job.get("fsdp.enable_fsdp")) and trainer_type(job) in _HF_TYPES:
        facts = LaunchFacts(source=job.filename, text=job.text)
        for key, name in _FSDP_KEYS.items():
            st = job.get(f"fsdp.{key}")
            if st is not None:
                facts.settings[name] = Setting(name, st.value, st.filename, st.line)
        facts.settings.setdefault("distributed_type", Setting("distributed_type", "FSDP", job.filename,
                                                              job.get("fsdp.enable_fsdp").line))
        facts.fsdp_version = 1
        job.fsdp_version_why = ("Oumi sets accelerate's FSDP environment without FSDP_VERSION "
                                "(core/distributed.py get_accelerate_env_vars): FSDP1")
        job.launch = facts
