"""axolotl YAML configs (`axolotl train cfg.yml`, `accelerate launch -m axolotl.cli.train cfg.yml`).

What axolotl builds from the config, read from its source (tags v0.4.0-v0.18.0, loaders/model.py,
formerly utils/models.py; utils/schemas/*.py; loaders/patch_manager.py), see `fsdplint.behaviour`:
- `adapter: qlora` + `load_in_4bit`: BitsAndBytesConfig(nf4, bnb_4bit_quant_storage=torch.bfloat16)
  (from v0.5.0); `adapter: lora` + `load_in_8bit`: BitsAndBytesConfig(load_in_8bit=True).
- `adapter: lora` + `load_in_4bit`: before v0.13.0 `load_in_4bit=True` went to from_pretrained as
  it was (uint8 storage); from v0.13.0 no 4-bit config is built for `adapter: lora`.
- axolotl rejects by itself: qlora in 8-bit, 4/8-bit without an adapter, FSDP2 + 4/8-bit with
  DPO/KTO/ORPO/IPO — those are not reported.
- FSDP is on with a non-empty `fsdp:` list or an `fsdp_config:` mapping; `fsdp_version` (top level,
  or in fsdp_config) defaults to 1; fsdp_config keys may carry accelerate's `fsdp_` prefix.
- FSDP2 keeps Params4bit (qlora) from v0.12.0 and Int8Params from v0.15.0 through its own patch.
- Under FSDP the config's device_map is dropped from v0.12.0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from fsdplint.launch.settings import LaunchFacts, Setting, _norm
from fsdplint.launch.tools.job import Gate, Job, Quant, dtype_name
from fsdplint.launch.tools.defaults import BEHAVIOUR, since

# Keys only axolotl configs combine with `base_model` (LLaMA-Factory and recipes use model_name_or_path).
_KEYS = frozenset({
    "sequence_len", "micro_batch_size", "adapter", "lora_target_linear", "lora_target_modules", "sample_packing",
    "dataset_prepared_path", "pad_to_sequence_len", "special_tokens", "load_in_4bit", "load_in_8bit",
    "datasets", "num_epochs", "val_set_size", "strict", "lora_r", "tokenizer_type", "base_model_config",
    "flash_attention", "train_on_inputs", "fsdp_version",
})
_DISPATCHING = ("auto", "balanced", "balanced_low_0", "sequential")
_RL_REFUSED_FSDP2_QUANT = ("dpo", "kto", "orpo", "ipo")


def looks_like(keys: set) -> bool:
    return "base_model" in keys and len(keys & _KEYS) >= 2


def _true(job: Job, key: str) -> bool:
    v = job.value(key)
    return v is True or (isinstance(v, str) and v.strip().lower() == "true")


def _gate(job: Job, behaviour: str, *, handled_from: bool) -> Gate:
    """The gate of a behaviour from whose version on axolotl handles the failure itself."""
    b = BEHAVIOUR[behaviour]
    got = since(behaviour, job.tool_version)
    if got is None:
        return Gate(None, f"axolotl < {b.since}: {b.before}; from {b.since}: {b.what}", "axolotl")
    if got == handled_from:
        return Gate(False, f"{job.version_text()}: {b.what}")
    return Gate(True, f"{job.version_text()}: {b.before}")


_REMEDY = {
    "FSDP201": "Use fsdp_version: 1 (axolotl then gives the 4-bit weights a bfloat16 quant storage), or axolotl "
               ">= 0.12.0 with `adapter: qlora`, which patches FSDP2 to keep Params4bit.",
    "FSDP202": "Use `adapter: qlora` with `load_in_4bit: true`: axolotl then sets bnb_4bit_quant_storage to "
               "bfloat16 for FSDP.",
    "FSDP203": "Use `adapter: qlora` with `load_in_4bit: true` (axolotl gives 4-bit weights a float quant storage "
               "for FSDP), or turn load_in_8bit off.",
    "FSDP009": "Remove device_map: FSDP places the shards itself (axolotl >= 0.12.0 drops it under FSDP).",
}


def fill(job: Job, versions: dict, path: Optional[Path]) -> None:
    job.model = job.get("base_model")
    job.remedy.update(_REMEDY)
    job.adapter = job.get("adapter")
    adapter = str(job.value("adapter") or "").strip().lower() or None
    _fill_fsdp(job)
    config_dir = path.parent if path is not None else None
    model_id = job.value("base_model_config") or job.value("base_model")
    job.model_ref = (model_id, job.value("model_type"), config_dir)

    # LoRA targets: lora_target_linear (every linear layer) is never a missing name.
    targets = job.value("lora_target_modules")
    if adapter in ("lora", "qlora") and not _true(job, "lora_target_linear") and targets:
        if isinstance(targets, str):
            targets = [targets]
        if isinstance(targets, list) and all(isinstance(t, str) for t in targets):
            job.lora_targets = list(targets)
            job.targets_setting = job.get("lora_target_modules")

    dm = job.get("device_map")
    if dm is not None and isinstance(dm.value, str) and dm.value.strip().lower() in _DISPATCHING:
        job.device_map = dm
        job.gates["FSDP009"] = _gate(job, "axolotl_fsdp_device_map", handled_from=True)

    _fill_quant(job, adapter)


def _fill_fsdp(job: Job) -> None:
    fsdp_list = job.get("fsdp")
    section = job.get("fsdp_config")
    on_list = fsdp_list is not None and bool(fsdp_list.value)
    on_section = section is not None and isinstance(section.value, dict) and bool(section.value)
    if not on_list and not on_section:
        return
    facts = LaunchFacts(source=job.filename, text=job.text)
    for key, st in job.values.items():
        if key.startswith("fsdp_config."):
            k = _norm(key.split(".", 1)[1])
            facts.settings[k] = Setting(k, st.value, st.filename, st.line)
    if on_list:
        v = fsdp_list.value
        words = " ".join(v) if isinstance(v, list) else str(v)
        facts.settings["sharding"] = Setting("sharding", words, fsdp_list.filename, fsdp_list.line)
    version = job.get("fsdp_version") or facts.get("version")
    try:
        facts.fsdp_version = int(str(version.value).strip()) if version is not None else 1
    except ValueError:
        facts.fsdp_version = 1
    if version is not None:
        facts.settings["version"] = Setting("version", facts.fsdp_version, version.filename, version.line)
        job.fsdp_version_why = f"fsdp_version: {facts.fsdp_version}"
    else:
        job.fsdp_version_why = "axolotl's default fsdp_version is 1"
    job.launch = facts


def _fill_quant(job: Job, adapter: Optional[str]) -> None:
    four, eight = _true(job, "load_in_4bit"), _true(job, "load_in_8bit")
    dtype = _model_dtype(job)
    rl = str(job.value("rl") or "").strip().lower()
    if job.fsdp_version == 2 and (four or eight) and rl in _RL_REFUSED_FSDP2_QUANT:
        return  # axolotl refuses FSDP2 + 4/8-bit for these RL trainers itself
    if adapter == "qlora" and four and not eight:
        kwargs = job.value("bnb_config_kwargs")
        storage = "bfloat16"
        st = job.get("load_in_4bit")
        if isinstance(kwargs, dict) and "bnb_4bit_quant_storage" in kwargs:
            storage = dtype_name(str(kwargs["bnb_4bit_quant_storage"])) or None
            st = job.get("bnb_config_kwargs.bnb_4bit_quant_storage") or st
        elif since("axolotl_qlora_fsdp_storage", job.tool_version) is False:
            storage = None
            job.gates["FSDP202"] = Gate(True, f"{job.version_text()}: "
                                              f"{BEHAVIOUR['axolotl_qlora_fsdp_storage'].before}")
        job.quant = Quant(4, job.get("load_in_4bit"), storage, st, dtype)
        if storage is not None and dtype is not None and storage != dtype and "FSDP202" not in job.gates:
            # A fixed bfloat16 storage next to fp16 weights: reported, but as a warning (not run here).
            job.gates["FSDP202"] = Gate(None, f"axolotl sets bnb_4bit_quant_storage={storage} whatever the "
                                              f"training dtype")
            job.remedy["FSDP202"] = ("Train in bf16 (`bf16: true`), or set bnb_config_kwargs: "
                                     "{bnb_4bit_quant_storage: float16}.")
        job.gates["FSDP201"] = _gate(job, "axolotl_fsdp2_4bit_patch", handled_from=True)
    elif adapter == "lora" and four and not eight:
        ignored = since("axolotl_lora_4bit_ignored", job.tool_version)
        if ignored:
            return  # no 4-bit config is built: the base loads unquantized
        b = BEHAVIOUR["axolotl_lora_4bit_ignored"]
        job.quant = Quant(4, job.get("load_in_4bit"), None, None, dtype)
        why = ("`adapter: lora` (not qlora) gets no bnb_4bit_quant_storage: axolotl's float storage for FSDP "
               "is set only for `adapter: qlora`")
        if ignored is None:
            job.gates["FSDP202"] = Gate(None, f"{why}; axolotl < {b.since} loads it in 4-bit with uint8 storage, "
                                              f"from {b.since} it loads the base unquantized", "axolotl")
        else:
            job.gates["FSDP202"] = Gate(True, f"{why} ({job.version_text()})")
        job.gates["FSDP201"] = Gate(True, f"{job.version_text()}: no FSDP2 support for its 4-bit weights")
    elif adapter == "lora" and eight and not four:
        job.quant = Quant(8, job.get("load_in_8bit"), None, None, dtype)
        if job.fsdp_version == 2:
            job.gates["FSDP203"] = _gate(job, "axolotl_fsdp2_8bit_patch", handled_from=True)


def _model_dtype(job: Job) -> Optional[str]:
    """axolotl's torch_dtype: bfloat16 with `bf16: true`/`auto` (on bf16 GPUs), float16 with fp16."""
    bf16, fp16 = job.value("bf16"), job.value("fp16")
    if bf16 is True or (isinstance(bf16, str) and bf16.strip().lower() in ("true", "auto")):
        return "bfloat16"
    if fp16 is True:
        return "float16"
    return None
