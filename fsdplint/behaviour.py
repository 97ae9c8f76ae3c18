"""What libraries do to a model or a job, by version: data with citations, consulted by the rules.

A rule that depends on how transformers, trl, peft or accelerate behave asks `holds(key, target)`
instead of hard-coding one release's behaviour. Each entry names the first release with the
behaviour (`since`), the first without it (`until`, when it stopped), what was read to establish it
(`read`: file and release) and what could not be checked (`unverified`).

`holds` answers True / False for a known target version and None when the version is unknown (not
declared, pinned or installed): a rule then stays silent, or reports a warning that says what to declare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from packaging.version import Version


@dataclass(frozen=True)
class Behaviour:
    key: str
    package: str
    what: str
    since: Optional[str]  # first release with it; None: every release fsdplint covers
    until: Optional[str] = None  # first release without it
    before: str = ""  # what it did before `since`, when a message needs to say it
    read: str = ""  # the sources read (file and release)
    unverified: str = ""  # what the table states without having read it


BEHAVIOURS: dict[str, Behaviour] = {b.key: b for b in (
    Behaviour(
        "trainer_peft_wrap_policy", "transformers",
        "With FSDP enabled, Trainer replaces the FSDP plugin's auto_wrap_policy with peft's "
        "fsdp_auto_wrap_policy(model) for a PEFT model before accelerator.prepare, so LoRA layers get their "
        "own units (FSDP1 + LoRA + use_orig_params=False then wraps); before it, a named policy put frozen and "
        "trainable parameters in one FlatParameter and wrapping raised.",
        since="4.39.0",
        read="transformers 5.24.0 trainer.py (`update_fsdp_plugin_peft` before `accelerator.prepare`) and "
             "distributed/fsdp.py (`update_fsdp_plugin_peft`: any PeftConfig); a 4.x trainer.py "
             "(`Trainer._fsdp_qlora_plugin_updates`: LoraConfig only)",
        unverified="the first release (4.39.0, the FSDP + QLoRA release that added _fsdp_qlora_plugin_updates) "
                   "is from its release notes; the 4.x source read had no version number",
    ),
    Behaviour(
        "save_pretrained_gathers_dtensors", "transformers",
        "save_pretrained calls full_tensor() on every DTensor of the state dict while writing the shards, so "
        "on an FSDP2 model (fully_shard, or accelerate's FSDP2) it all-gathers each parameter: called on every "
        "rank it writes the full weights; called on one rank only it hangs in the first all-gather.",
        since="4.51.0", until="5.24.0",
        read="a transformers 5.x modeling_utils.py save_pretrained (with save_original_format; `if "
             "_is_dtensor_available and isinstance(tensor, DTensor): tensor = tensor.full_tensor()`); "
             "transformers 5.24.0 modeling_utils.py (no DTensor gather left: only distributed_config models "
             "are gathered, see save_pretrained_gathers_distributed)",
        unverified="the first release (4.51.0, with tensor-parallel saving) and the last one before 5.24 that "
                   "still gathers were not read; 5.x releases before 5.24 are assumed to gather",
    ),
    Behaviour(
        "save_pretrained_gathers_distributed", "transformers",
        "save_pretrained on a model loaded with transformers' own `distributed_config=` (data-parallel "
        "sharding) gathers the full state dict itself (get_model_state_dict(full_state_dict=True)); it must "
        "be called on every rank, and rank 0 writes. A model sharded by fully_shard/accelerate is not "
        "gathered: its state dict still holds this rank's DTensor shards.",
        since="5.24.0",
        read="transformers 5.24.0 modeling_utils.py (save_pretrained -> gather_sharded_state_dict_for_save), "
             "distributed/mixin.py (dp_size > 1 -> gather_full_state_dict), distributed/utils.py",
        unverified="releases of 5.x before 5.24 were not read: the table starts at 5.24.0",
    ),
    Behaviour(
        "trl_peft_input_grads", "trl",
        "trl's SFTTrainer and DPOTrainer, given peft_config (or a PEFT model) with gradient checkpointing, "
        "make the inputs require grad themselves (enable_input_require_grads, or prepare_model_for_kbit_training "
        "for a quantized model), so reentrant checkpointing of a frozen base gets gradients.",
        since=None,
        read="trl v0.8.0, v0.11.0, v0.13.0, v0.15.0, v0.19.0, v0.21.0 trainer/sft_trainer.py and "
             "trainer/dpo_trainer.py (enable_input_require_grads under peft_config + gradient_checkpointing); "
             "v0.23.0-v0.25.0 models/utils.py (prepare_peft_model); v0.27.0-v1.5.0 and main trainer/sft_trainer.py",
    ),
    Behaviour(
        "trl_grpo_peft_input_grads", "trl",
        "trl's GRPOTrainer (and at main KTO, Reward, RLOO) enable input grads for PEFT models with "
        "gradient checkpointing.",
        since="0.17.0",
        read="trl v0.15.0 (absent) and v0.17.0, v1.5.0, main trainer/grpo_trainer.py (present)",
    ),
    Behaviour(
        "training_args_fsdp_default_v2", "transformers",
        "TrainingArguments(fsdp=...) without fsdp_config['version'] means FSDP2.",
        since="5.10.0",
        before="TrainingArguments(fsdp=...) without a version ran FSDP1",
        read="transformers 5.9.0 training_args.py (`fsdp_config.get(\"version\", 1)`), 5.10.0 and 5.24.0 "
             "(`fsdp_config.get(\"version\", 2)`); transformers#45640 (\"Default to FSDP2\")",
    ),
    Behaviour(
        "peft_autocast_adapter_dtype", "peft",
        "get_peft_model(autocast_adapter_dtype=True) is the default and upcasts fp16/bf16 adapter weights to "
        "float32, so a LoRA unit mixes float32 adapters with a bf16 base unless it is passed False.",
        since="0.12.0",
        read="peft 0.21.2 mapping_func.py (default True); peft v0.11.1 mapping.py (absent) and v0.12.0 (present)",
    ),
    Behaviour(
        "accelerate_fsdp2_ignores_params4bit", "accelerate",
        "accelerate's fsdp2_prepare_model passes the frozen non-floating Params4bit as ignored_params "
        "(torch >= 2.7 only), so the uint8-stored 4-bit base is replicated, not sharded.",
        since="1.14.0",
        read="accelerate 1.15.0 utils/fsdp_utils.py (\"Exclude non-floating frozen Params4bit\", gated on "
             "is_torch_version('>=', '2.7.0')); v1.13.0 (absent) and v1.14.0 (present)",
    ),
    Behaviour(
        "accelerate_fsdp2_requires_torch_2_6", "accelerate",
        "accelerate's FSDP2 (FullyShardedDataParallelPlugin(fsdp_version=2), or fsdp_version: 2 in a launch "
        "config) raises ImportError on torch < 2.6: a job that uses it already needs torch >= 2.6.",
        since="1.7.0",
        read="accelerate v1.6.0 utils/constants.py (FSDP2_PYTORCH_VERSION = \"2.5.1\"), v1.7.0 and 1.15.0 "
             "(\"2.6.0\"); 1.15.0 utils/dataclasses.py and accelerator.py raise for fsdp_version == 2 below it",
    ),
    Behaviour(
        "transformers_kv_cache_object", "transformers",
        "Decoder layers write their keys/values into a Cache object (DynamicCache) passed through the forward, "
        "so a layer recomputed by activation checkpointing appends to the cache a second time.",
        since="4.36.0",
        before="layers returned new (key, value) tuples: a recomputed layer mutates nothing",
        read="transformers 4.35.2 models/llama/modeling_llama.py (`past_key_value = (key_states, value_states)`, "
             "no cache_utils.py) and 4.36.0 cache_utils.py, modeling_llama.py and modeling_mixtral.py "
             "(`past_key_value.update(...)`)",
        unverified="4.36.0 moved Llama/Mistral/Mixtral; other architectures (T5 in 4.36.0 still returns tuples) "
                   "moved later, release by release, and are not tracked per model",
    ),
    # -- Lightning (Trainer and Fabric): what FSDPStrategy passes to FSDP1 and saves --------------------
    Behaviour(
        "lightning_fsdp_use_orig_params", "lightning",
        "FSDPStrategy (Fabric and Trainer) passes use_orig_params=True to FullyShardedDataParallel unless the "
        "strategy is given use_orig_params= (on torch >= 2.0), so the module keeps its original parameters: an "
        "optimizer built from them, or from the LightningModule's own self.parameters(), steps the trained "
        "weights.",
        since="2.1.0",
        before="use_orig_params was left to torch (False): Fabric's setup_optimizers and the Trainer raise "
               "\"The optimizer does not seem to reference any FSDP parameters\" for an optimizer over the "
               "unwrapped parameters, and Fabric refuses setup(model, optimizer)",
        read="Lightning 2.0.0 and 2.0.9 src/lightning/{fabric,pytorch}/strategies/fsdp.py (no use_orig_params; "
             "fabric setup_module_and_optimizers raises NotImplementedError); 2.1.0 (`self._fsdp_kwargs."
             "setdefault(\"use_orig_params\", True)` / `self.kwargs.setdefault(...)` under _TORCH_GREATER_EQUAL_2_0); "
             "1.9.5 src/pytorch_lightning/strategies/fully_sharded_native.py (setup_optimizers raises the same "
             "ValueError); CHANGELOG 2.1.0 (#17309)",
    ),
    Behaviour(
        "lightning_fsdp_full_checkpoint", "lightning",
        "The Trainer's FSDPStrategy checkpoints the wrapped model's state dict, gathered under FSDP's "
        "state_dict_type context (state_dict_type=\"full\" by default).",
        since="2.1.0",
        before="the strategy inherited Strategy.lightning_module_state_dict, the state_dict() of the unwrapped "
               "LightningModule inside FSDP, which misses the weights FSDP flattened into the root's "
               "FlatParameter: checkpoints (ModelCheckpoint, trainer.save_checkpoint) load with missing keys",
        read="Lightning 1.9.5 pytorch_lightning/strategies/fully_sharded_native.py and 2.0.0 src/lightning/pytorch/"
             "strategies/fsdp.py (no lightning_module_state_dict); 2.1.0 (lightning_module_state_dict with "
             "_get_full_state_dict_context / _get_sharded_state_dict_context); CHANGELOG 2.1.0 (#16558 \"Enabled "
             "saving the full model state dict when using the FSDPStrategy\")",
    ),
    Behaviour(
        "lightning_trainer_fsdp_is_torch", "lightning",
        "Trainer(strategy=\"fsdp\") is torch's FullyShardedDataParallel (FSDPStrategy); before 2.0 the torch "
        "strategy was strategy=\"fsdp_native\" and \"fsdp\" meant FairScale's DDPFullyShardedStrategy.",
        since="2.0.0",
        read="Lightning 1.8.6 and 1.9.5 pytorch_lightning/strategies/fully_sharded.py (\"fsdp\": FairScale) and "
             "fully_sharded_native.py (\"fsdp_native\", \"fsdp_native_full_shard_offload\"); 2.0.0 CHANGELOG "
             "(\"strategy=\\\"fsdp_native\\\" is now strategy=\\\"fsdp\\\"\"); lightning_fabric 1.9.5 registers \"fsdp\" "
             "and \"fsdp_full_shard_offload\" for torch FSDP",
    ),
    # -- training tools (axolotl, LLaMA-Factory): what the tool builds from its config --------------
    Behaviour(
        "axolotl_qlora_fsdp_storage", "axolotl",
        "`adapter: qlora` + `load_in_4bit` builds BitsAndBytesConfig(bnb_4bit_quant_storage=torch.bfloat16)",
        since="0.5.0",
        before="no bnb_4bit_quant_storage (uint8)",
        read="axolotl v0.5.0 src/axolotl/utils/models.py, v0.18.0 src/axolotl/loaders/model.py (set_quantization_config)",
    ),
    Behaviour(
        "axolotl_lora_4bit_ignored", "axolotl",
        "`adapter: lora` + `load_in_4bit` builds no 4-bit config (only `adapter: qlora` quantizes to 4 bits)",
        since="0.13.0",
        before="`adapter: lora` + `load_in_4bit` passed load_in_4bit=True to from_pretrained (uint8 storage)",
        read="axolotl v0.12.0 loaders/model.py (`model_kwargs[\"load_in_4bit\"] = cfg.load_in_4bit`), v0.13.0 (removed)",
    ),
    Behaviour(
        "axolotl_fsdp2_4bit_patch", "axolotl",
        "with fsdp_version 2 and `adapter: qlora`, axolotl patches FSDP2's FSDPParam to keep Params4bit",
        since="0.12.0",
        before="no FSDP2 support for Params4bit",
        read="axolotl#2992; v0.12.0 src/axolotl/monkeypatch/fsdp2_qlora.py, loaders/patch_manager.py",
    ),
    Behaviour(
        "axolotl_fsdp2_8bit_patch", "axolotl",
        "with fsdp_version 2 and load_in_8bit, axolotl patches FSDP2 to keep Int8Params",
        since="0.15.0",
        before="no FSDP2 support for Int8Params",
        read="axolotl v0.15.0 loaders/patch_manager.py `_apply_fsdp2_bnb_patches` (load_in_4bit or load_in_8bit)",
    ),
    Behaviour(
        "axolotl_fsdp_device_map", "axolotl",
        "under FSDP axolotl drops the config's device_map (\"FSDP requires control over device placement\")",
        since="0.12.0",
        before="the config's device_map was passed to from_pretrained",
        read="axolotl v0.12.0 loaders/model.py `_set_device_map_config`",
    ),
    Behaviour(
        "llamafactory_fsdp_bnb_check", "llamafactory",
        "under FSDP LLaMA-Factory requires transformers>=4.39.0 and bitsandbytes>=0.43.0 itself (ImportError)",
        since="0.8.0",
        before="only under DeepSpeed ZeRO-3; under FSDP an older transformers/bitsandbytes silently keeps uint8 storage",
        read="LLaMA-Factory v0.6.0 src/llmtuner/model/patcher.py, v0.8.0 src/llamafactory/model/model_utils/quantization.py",
    ),
    Behaviour(
        "llamafactory_fsdp_8bit_refused", "llamafactory",
        "8-bit under FSDP raises \"Only 4-bit quantized model can use fsdp+qlora\"",
        since="0.8.2",
        before="8-bit under FSDP reached FSDP's flattening",
        read="LLaMA-Factory commit 60d9896a7 (v0.8.2) model_utils/quantization.py",
    ),
)}


def holds(key: str, target) -> Optional[bool]:
    """Whether the behaviour holds for `target` (a versions.TargetVersion): None when the version is not
    known (an unknown version, or only a lower bound the code proves)."""
    b = BEHAVIOURS[key]
    if b.since is None and b.until is None:
        return True  # every release fsdplint covers
    v: Version = target.version
    if not getattr(target, "known", True):
        # A proven lower bound decides a behaviour that started at or below it and never stopped.
        if getattr(target, "kind", "") == "code" and b.until is None and b.since is not None and v >= Version(b.since):
            return True
        return None
    if b.since is not None and v < Version(b.since):
        if v.is_prerelease and Version(v.base_version) == Version(b.since):
            return None  # a development build of the release that brought it: either side of the change
        return False
    if b.until is not None and v >= Version(b.until):
        return False
    return True


def cite(key: str) -> str:
    """A short citation for messages and docs: what was read."""
    b = BEHAVIOURS[key]
    return f"{b.package} {('>= ' + b.since) if b.since else '(all covered releases)'}; read: {b.read}"


def training_args_fsdp_version(transformers) -> Optional[int]:
    """The FSDP version `TrainingArguments(fsdp=...)` means without `fsdp_config["version"]`: 2 from
    transformers 5.10, 1 before, None when the transformers version is unknown. (For launch.py, which today
    reads it as FSDP1 on every release.)"""
    holds_v2 = holds("training_args_fsdp_default_v2", transformers)
    return None if holds_v2 is None else (2 if holds_v2 else 1)
