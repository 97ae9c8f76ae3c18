"""`fsdplint model cfg.yaml`: an axolotl / LLaMA-Factory job as an audit spec.

The job gives the LoRA, quantization and FSDP sections (as the tool builds them) and the YAML line of
each; the model comes from `--config-json` or a local model directory named by the job (the weights
are never read: only config.json).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from fsdplint.launch.tools.defaults import use_orig_params_default
from fsdplint.launch.tools.job import Job

_WRAP_KEYS = ("transformer_layer_cls_to_wrap", "transformer_cls_names_to_wrap")


def spec_for_job(job: Job, config_json: Optional[str]) -> Any:
    """An AuditSpec for `job`; the findings point at its YAML lines."""
    from fsdplint.audit.spec import AuditInputError, _read_mapping, spec_from_dict

    yaml_path = Path(job.filename)
    if config_json:
        cfg_path = Path(config_json)
    else:
        model = job.model.value if job.model is not None else None
        local = Path(str(model)) if isinstance(model, str) else None
        if local is not None and not local.is_absolute():
            local = yaml_path.parent / local
        if local is None or not (local / "config.json").is_file():
            row = job.model.line if job.model is not None else 1
            raise AuditInputError(
                f"{job.filename}:{row}: the model {model!r} is not a local directory with a config.json; "
                f"give its weights-free config with --config-json config.json")
        cfg_path = local / "config.json"
    if cfg_path.is_dir():
        cfg_path = cfg_path / "config.json"
    cfg, _ = _read_mapping(cfg_path, "model config")
    data: dict = {"model": {"config": cfg}}
    locations: dict = {}
    q = job.quant
    if q is not None:
        from fsdplint.launch.tools.llamafactory import INFERRED_DTYPE, inferred_dtype

        def concrete(dtype):  # a dtype the tool infers from the checkpoint: the one it picks for this config
            return inferred_dtype(cfg.get("torch_dtype")) if dtype == INFERRED_DTYPE else dtype

        if q.bits == 4:
            data["quantization"] = {"load_in_4bit": True, "bnb_4bit_quant_storage": concrete(q.storage) or "uint8"}
        else:
            data["quantization"] = {"load_in_8bit": True}
        locations["quantization"] = (q.setting.line, 1)
        if q.model_dtype:
            data["dtype"] = concrete(q.model_dtype)
    if job.adapter is not None:
        lora: dict = {"r": int(job.value("lora_r", job.value("lora_rank", 8)) or 8)}
        alpha = job.value("lora_alpha")
        if isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
            lora["lora_alpha"] = alpha
        lora["target_modules"] = job.lora_targets or "all-linear"
        data["lora"] = lora
        locations["lora"] = (job.adapter.line, 1)
        if job.targets_setting is not None:
            locations["lora.target_modules"] = (job.targets_setting.line, 1)
    facts = job.launch
    if facts is not None and facts.fsdp_version in (1, 2):
        # Positions only for settings in the job's own file (an accelerate config elsewhere has its own lines).
        here = Path(facts.source or "") == yaml_path
        fsdp: dict = {"version": facts.fsdp_version}
        if here:
            locations["fsdp"] = (min((s.line for s in facts.settings.values()), default=1), 1)
        for key in _WRAP_KEYS:
            st = facts.get(key)
            if st is not None and st.value:
                v = st.value
                fsdp["wrap"] = [w.strip() for w in v.split(",")] if isinstance(v, str) else list(v)
                if here:
                    locations["fsdp.wrap"] = (st.line, 1)
        if facts.fsdp_version == 1:
            uop = facts.get("use_orig_params")
            # The HF Trainer (all three train with it) defaults use_orig_params to true and switches PEFT
            # models to peft's fsdp_auto_wrap_policy (transformers training_args.py, distributed/fsdp.py).
            fsdp["use_orig_params"] = _truthy(uop.value) if uop is not None else use_orig_params_default("trainer")
            if uop is not None and here:
                locations["fsdp.use_orig_params"] = (uop.line, 1)
            if job.adapter is not None:
                fsdp["auto_wrap_policy"] = "peft"
        data["fsdp"] = fsdp
    spec = spec_from_dict(data, filename=job.filename, base_dir=yaml_path.parent, text=job.text,
                          model_source=str(cfg_path), locations=locations)
    spec.version_path = yaml_path
    return spec


def _truthy(v: Any) -> bool:
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "1", "yes"))
