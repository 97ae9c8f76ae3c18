"""LLaMA-Factory YAML configs (`llamafactory-cli train cfg.yaml`, `accelerate launch ... src/train.py cfg.yaml`).

What LLaMA-Factory builds, read from its source (tags v0.6.0-v0.9.5 and the main branch:
model_utils/quantization.py, formerly model/patcher.py; hparams/model_args.py, finetuning_args.py):
- `quantization_bit: 4` (bitsandbytes, the default method): BitsAndBytesConfig(load_in_4bit=True,
  bnb_4bit_quant_storage=compute_dtype) with the model loaded in compute_dtype (from v0.6.0,
  "support fsdp + qlora"). transformers < 4.39 / bitsandbytes < 0.43 drop that keyword silently
  (uint8 storage); from v0.7.1 LLaMA-Factory refuses those versions under FSDP itself.
- `quantization_bit: 8`: BitsAndBytesConfig(load_in_8bit=True); from v0.7.1 refused under FSDP
  ("Only 4-bit quantized model can use auto device map.", from v0.8.2 "... fsdp+qlora or auto device map.").
- FSDP comes from the accelerate config it is launched with, or from TrainingArguments' `fsdp` /
  `fsdp_config` keys in the same YAML (FSDP version then as the Trainer defaults it).
- `lora_target: all` adapts every linear layer; otherwise a comma-separated list of names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from packaging.version import Version

from fsdplint.launch.settings import LaunchFacts, Setting, _norm
from fsdplint.launch.tools.job import Gate, Job, Quant, dtype_name
from fsdplint.launch.tools.defaults import BEHAVIOUR, QUANT_STORAGE_NEEDS, known, since, trainer_fsdp_version

_STAGES = ("pt", "sft", "rm", "ppo", "dpo", "kto")
_KEYS = frozenset({"stage", "finetuning_type", "template", "dataset", "lora_target", "quantization_bit",
                   "cutoff_len", "dataset_dir", "lora_rank"})


def looks_like(keys: set) -> bool:
    return "model_name_or_path" in keys and ("stage" in keys or "finetuning_type" in keys) and len(keys & _KEYS) >= 2


_REMEDY = {
    "FSDP201": "Launch with an FSDP1 accelerate config (fsdp_version: 1): LLaMA-Factory gives the 4-bit weights "
               "the compute dtype as quant storage, which FSDP1 flattens.",
    "FSDP202": "Install transformers >= 4.39.0 and bitsandbytes >= 0.43.0, which honour bnb_4bit_quant_storage.",
    "FSDP203": "Use quantization_bit: 4 (LLaMA-Factory gives 4-bit weights a float quant storage for FSDP).",
}


def fill(job: Job, versions: dict, path: Optional[Path]) -> None:
    job.model = job.get("model_name_or_path")
    job.remedy.update(_REMEDY)
    ft = str(job.value("finetuning_type", "lora") or "lora").strip().lower()
    if ft == "lora":
        job.adapter = job.get("finetuning_type") or job.get("lora_target")
    config_dir = path.parent if path is not None else None
    job.model_ref = (job.value("model_name_or_path"), None, config_dir)
    target = job.value("lora_target")
    if ft == "lora" and isinstance(target, str) and target.strip() and target.strip().lower() != "all":
        job.lora_targets = [t.strip() for t in target.split(",") if t.strip()]
        job.targets_setting = job.get("lora_target")
    _fill_fsdp(job, versions)
    _fill_quant(job, versions)


def _fill_fsdp(job: Job, versions: dict) -> None:
    fsdp = job.get("fsdp")
    if fsdp is None or fsdp.value in (None, "", False, []):
        return
    facts = LaunchFacts(source=job.filename, text=job.text)
    words = " ".join(fsdp.value) if isinstance(fsdp.value, list) else str(fsdp.value)
    facts.settings["sharding"] = Setting("sharding", words, fsdp.filename, fsdp.line)
    for key, st in job.values.items():
        if key.startswith("fsdp_config."):
            k = _norm(key.split(".", 1)[1])
            facts.settings[k] = Setting(k, st.value, st.filename, st.line)
    version = facts.get("version")
    if version is not None:
        try:
            facts.fsdp_version = int(str(version.value).strip())
        except ValueError:
            facts.fsdp_version = 1
        job.fsdp_version_why = f"fsdp_config version: {facts.fsdp_version}"
    else:
        facts.fsdp_version, job.fsdp_version_why = trainer_fsdp_version(versions.get("transformers"))
    job.launch = facts


def use_launch(job: Job, facts: LaunchFacts, why: str) -> None:
    """FSDP settings from the accelerate config the job is launched with (when the YAML has none)."""
    if job.launch is None and facts.uses_fsdp:
        job.launch = facts
        job.fsdp_version_why = why


# The compute dtype when the YAML writes none: model/patcher.py infers it from the checkpoint's torch_dtype
# (extras/misc.py infer_optim_dtype, the same at v0.6.0 and v0.9.0: bfloat16 for a bfloat16 checkpoint where
# bf16 is available, else float16 where fp16 is, else float32) - a float dtype, whichever it is.
INFERRED_DTYPE = "bfloat16 or float16 (inferred from the checkpoint's dtype)"


def inferred_dtype(checkpoint_dtype) -> str:
    """The dtype infer_optim_dtype picks on a GPU with bf16 for a checkpoint's `torch_dtype`."""
    return "bfloat16" if dtype_name(checkpoint_dtype) == "bfloat16" else "float16"


def _compute_dtype(job: Job) -> Optional[str]:
    for key, dt in (("pure_bf16", "bfloat16"), ("bf16", "bfloat16"), ("fp16", "float16")):
        if job.value(key) is True:
            return dt
    # (`infer_dtype` counts only when the model is not trained: model/patcher.py `not is_trainable`.)
    return INFERRED_DTYPE


def _fill_quant(job: Job, versions: dict) -> None:
    bits = job.value("quantization_bit")
    method = str(job.value("quantization_method", "bnb") or "bnb").strip().lower()
    if method not in ("bnb", "bitsandbytes") or bits not in (4, 8, "4", "8"):
        return
    bits = int(bits)
    dtype = _compute_dtype(job)
    st = job.get("quantization_bit")
    if bits == 8:
        job.quant = Quant(8, st, None, None, dtype)
        b = BEHAVIOUR["llamafactory_fsdp_8bit_refused"]
        got = since("llamafactory_fsdp_8bit_refused", job.tool_version)
        if got:
            job.gates["FSDP203"] = Gate(False, f"{job.version_text()}: {b.what}")
        elif got is None:
            job.gates["FSDP203"] = Gate(None, f"LLaMA-Factory >= {b.since} refuses 8-bit under FSDP itself, older "
                                              f"versions reach FSDP's flattening", "LLaMA-Factory (llamafactory)")
        return
    # 4-bit: the storage is compute_dtype, unless the libraries are too old to know the keyword.
    job.quant = Quant(4, st, dtype, st, dtype)
    old = []
    for pkg, need in QUANT_STORAGE_NEEDS.items():
        tv = versions.get(pkg)
        if known(tv) and tv.version < Version(need):
            old.append(f"{tv.describe()} < {need}")
    if not old:
        return
    b = BEHAVIOUR["llamafactory_fsdp_bnb_check"]
    got = since("llamafactory_fsdp_bnb_check", job.tool_version)
    drop = (f"bnb_4bit_quant_storage (which LLaMA-Factory sets to the compute dtype for FSDP) is dropped by "
            f"{' and '.join(old)}, so the 4-bit weights keep uint8 storage")
    job.quant.storage = None
    if got:
        job.gates["FSDP202"] = Gate(False, f"{job.version_text()}: {b.what}")
    elif got is None:
        job.gates["FSDP202"] = Gate(None, f"{drop}; LLaMA-Factory >= {b.since} refuses these versions under FSDP "
                                          f"itself", "LLaMA-Factory (llamafactory)")
    else:
        job.gates["FSDP202"] = Gate(True, f"{drop} ({job.version_text()} does not check)")
