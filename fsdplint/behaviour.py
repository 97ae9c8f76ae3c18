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

from packaging.version import InvalidVersion, Version


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
    # The two adjacent releases read for `since` (last without, first with) and for `until` (last with,
    # first without); empty when the boundary was not bisected (the facts page then says "unverified").
    since_read: tuple[str, ...] = ()
    until_read: tuple[str, ...] = ()
    check: str = ""  # the command that re-checks the boundary (bench/facts/release_bisect.py ...) or the run


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
        unverified="the 4.x source read had no version number; the first release of _fsdp_qlora_plugin_updates "
                   "was bisected (4.38.2 without, 4.39.0 with)",
        since_read=("4.38.2", "4.39.0"),
        check="python bench/facts/release_bisect.py transformers transformers/trainer.py --regex "
              "_fsdp_qlora_plugin_updates",
    ),
    Behaviour(
        "trainer_fsdp_use_orig_params_default", "transformers",
        "The Trainer's FSDP1 (TrainingArguments fsdp=...) passes use_orig_params=True when fsdp_config leaves "
        "it out, so a unit may mix frozen and trainable parameters (torch >= 2.1).",
        since="4.36.0",
        before="the Trainer's FSDP1 used use_orig_params=False unless fsdp_config said otherwise: a unit "
               "mixing frozen base and trainable LoRA weights raised at wrap",
        read="transformers 4.28.1 trainer.py (_wrap_model builds FSDP(...) without use_orig_params: torch's "
             "False); 4.30.0 trainer.py (`fsdp_config.get(\"use_orig_params\", False)`); 4.33.1 and 4.35.2 "
             "training_args.py (`fsdp_config.get(\"use_orig_params\", \"false\")`); 4.36.0 and 5.24.0 "
             "(`... \"true\"`)",
        since_read=("4.35.2", "4.36.0"),
        check="python bench/facts/release_bisect.py transformers transformers/training_args.py --regex "
              "'use_orig_params\", \"true\"' --from 4.28.0 --to 5.0.0",
    ),
    Behaviour(
        "save_pretrained_gathers_dtensors", "transformers",
        "save_pretrained calls full_tensor() on every DTensor of the state dict while writing the shards, so "
        "on an FSDP2 model (fully_shard, or accelerate's FSDP2) it all-gathers each parameter: called on every "
        "rank it writes the full weights; called on one rank only it hangs in the first all-gather.",
        since="4.52.0", until="5.1.0",
        read="transformers 4.51.3 modeling_utils.py (no full_tensor), 4.52.1 and 4.57.6 (`if _is_dtensor_available "
             "and isinstance(state_dict[tensor], DTensor): full_tensor = state_dict[tensor].full_tensor()`), 5.0.0 "
             "(`tensor = tensor.full_tensor()`), 5.1.0, 5.9.0 and 5.24.0 (no full_tensor left: only "
             "distributed_config models are gathered, see save_pretrained_gathers_distributed)",
        unverified="4.52.0 is not on the package index: the first release read with the gather is 4.52.1",
        since_read=("4.51.3", "4.52.1"),
        until_read=("5.0.0", "5.1.0"),
        check="python bench/facts/release_bisect.py transformers transformers/modeling_utils.py --regex "
              "'\\.full_tensor\\(\\)' (add --until --from 5.0.0 for the end)",
    ),
    Behaviour(
        "save_pretrained_gathers_distributed", "transformers",
        "save_pretrained on a model loaded with transformers' own `distributed_config=` (data-parallel "
        "sharding) gathers the full state dict itself (get_model_state_dict(full_state_dict=True)); it must "
        "be called on every rank, and rank 0 writes. A model sharded by fully_shard/accelerate is not "
        "gathered: its state dict still holds this rank's DTensor shards.",
        since="5.15.0",
        read="transformers 5.14.1 modeling_utils.py (no gather_sharded_state_dict_for_save; no distributed/mixin.py) "
             "and 5.15.0 (save_pretrained -> self.gather_sharded_state_dict_for_save, distributed/mixin.py and "
             "distributed/utils.py added); 5.24.0 distributed/mixin.py (dp_size > 1 -> gather_full_state_dict)",
        unverified="the dp_size > 1 condition was read at 5.24.0 only; the boundary is where the gather first appears",
        since_read=("5.14.1", "5.15.0"),
        check="python bench/facts/release_bisect.py transformers transformers/modeling_utils.py --regex "
              "gather_sharded_state_dict_for_save --from 5.0.0",
    ),
    Behaviour(
        "fsdp2_clip_norm_replicated", "torch",
        "torch.nn.utils.clip_grad_norm_ over an FSDP2 (fully_shard) model returns a Replicate DTensor: "
        ".item() on every rank is the global norm (equal to an unsharded copy's).",
        since="2.13.0",
        read="measured: torch 2.13.0 CPU, 2 gloo ranks (bench/facts/fsdp501_cpu_check.py): DTensor "
             "placements (Replicate(),), .item() equal to the unsharded norm on both ranks",
        unverified="releases before 2.13.0 were not run or read (their wheels are not installable here); "
                   "the first release with a Replicate norm is not bisected, so 2.13.0 is only the oldest "
                   "release measured",
        check="python bench/facts/fsdp501_cpu_check.py",
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
        "trl's GRPOTrainer enables input grads for PEFT models with reentrant gradient checkpointing.",
        since="0.16.0",
        read="trl 0.15.2 (absent) and 0.16.0 (present: `_enable_gradient_checkpointing` calls "
             "model.enable_input_require_grads() for reentrant checkpointing) trl/trainer/grpo_trainer.py, "
             "the adjacent releases (bench/facts/release_bisect.py trl trl/trainer/grpo_trainer.py --regex "
             "enable_input_require_grads); v1.5.0 and main (present)",
        since_read=("0.15.2", "0.16.0"),
        check="python bench/facts/release_bisect.py trl trl/trainer/grpo_trainer.py --regex enable_input_require_grads",
    ),
    Behaviour(
        "trl_kto_peft_input_grads", "trl",
        "trl's KTOTrainer given peft_config (or a PEFT model) with gradient checkpointing enables input grads "
        "(enable_input_require_grads, or prepare_model_for_kbit_training for a quantized model).",
        since=None,
        read="trl 0.8.0 trl/trainer/kto_trainer.py (under peft_config + gradient_checkpointing), the first release "
             "read; the same regex holds at every release bisected after it",
        unverified="releases before 0.8.0 were not read",
        check="python bench/facts/release_bisect.py trl trl/trainer/kto_trainer.py --regex enable_input_require_grads --linear",
    ),
    Behaviour(
        "trl_reward_peft_input_grads", "trl",
        "trl's RewardTrainer enables input grads for a PEFT model with gradient checkpointing.",
        since="0.26.0",
        read="trl 0.25.1 (absent) and 0.26.0 (present: `if is_peft_available() and isinstance(model, PeftModel) and "
             "args.gradient_checkpointing: model.enable_input_require_grads()`) trl/trainer/reward_trainer.py",
        since_read=("0.25.1", "0.26.0"),
        check="python bench/facts/release_bisect.py trl trl/trainer/reward_trainer.py --regex enable_input_require_grads",
    ),
    Behaviour(
        "trl_rloo_peft_input_grads", "trl",
        "trl's RLOOTrainer enables input grads for a PEFT model with gradient checkpointing.",
        since="0.27.0",
        read="trl 0.26.2 (absent) and 0.27.0 (present, the same block as RewardTrainer's) trl/trainer/rloo_trainer.py",
        since_read=("0.26.2", "0.27.0"),
        check="python bench/facts/release_bisect.py trl trl/trainer/rloo_trainer.py --regex enable_input_require_grads",
    ),
    Behaviour(
        "training_args_fsdp_default_v2", "transformers",
        "TrainingArguments(fsdp=...) without fsdp_config['version'] means FSDP2.",
        since="5.10.0",
        before="TrainingArguments(fsdp=...) without a version ran FSDP1",
        read="transformers 5.9.0 training_args.py (`fsdp_config.get(\"version\", 1)`), 5.10.0 and 5.24.0 "
             "(`fsdp_config.get(\"version\", 2)`); transformers#45640 (\"Default to FSDP2\")",
        since_read=('5.9.0', '5.10.1'),
        check='python bench/facts/release_bisect.py transformers transformers/training_args.py --regex \'get\\("version", 2\\)\'',
    ),
    Behaviour(
        "peft_autocast_adapter_dtype", "peft",
        "get_peft_model(autocast_adapter_dtype=True) is the default and upcasts fp16/bf16 adapter weights to "
        "float32, so a LoRA unit mixes float32 adapters with a bf16 base unless it is passed False.",
        since="0.12.0",
        read="peft 0.21.2 mapping_func.py (default True); peft v0.11.1 mapping.py (absent) and v0.12.0 (present)",
        since_read=("0.11.1", "0.12.0"),
        check="python bench/facts/release_bisect.py peft peft/mapping.py --regex autocast_adapter_dtype",
    ),
    Behaviour(
        "accelerate_fsdp2_ignores_params4bit", "accelerate",
        "accelerate's fsdp2_prepare_model passes the frozen non-floating Params4bit as ignored_params "
        "(torch >= 2.7 only), so the uint8-stored 4-bit base is replicated, not sharded.",
        since="1.14.0",
        read="accelerate 1.15.0 utils/fsdp_utils.py (\"Exclude non-floating frozen Params4bit\", gated on "
             "is_torch_version('>=', '2.7.0')); v1.13.0 (absent) and v1.14.0 (present)",
        since_read=('1.13.0', '1.14.0'),
        check="python bench/facts/release_bisect.py accelerate accelerate/utils/fsdp_utils.py --regex 'Exclude non-floating frozen Params4bit'",
    ),
    Behaviour(
        "accelerate_fsdp2_passes_ignored_params", "accelerate",
        "accelerate's fsdp2_prepare_model puts `ignored_params` into the fully_shard keyword arguments on every "
        "torch release (an empty set when no ignored_modules are configured), so any FSDP2 model it prepares "
        "raises TypeError: fully_shard() got an unexpected keyword argument 'ignored_params' on torch < 2.7.",
        since="1.11.0", until="1.13.0",
        read="accelerate v1.10.1 utils/fsdp_utils.py (no ignored_params); v1.11.0 and v1.12.0 (fsdp2_kwargs "
             "always holds \"ignored_params\": get_parameters_from_modules(...), which returns set() for None); "
             "v1.13.0 (only when is_torch_version(\">=\", \"2.7.0\") and ignored_modules is not None, accelerate#3924)",
        since_read=('1.10.1', '1.11.0'),
        until_read=('1.12.0', '1.13.0'),
        check='python bench/facts/release_bisect.py accelerate accelerate/utils/fsdp_utils.py --regex \'"ignored_params"\' (since); --regex \'is_torch_version\\(">=", "2.7.0"\\) and .*ignored_modules\' (until)',
    ),
    Behaviour(
        "accelerate_fsdp2_requires_torch_2_6", "accelerate",
        "accelerate's FSDP2 (FullyShardedDataParallelPlugin(fsdp_version=2), or fsdp_version: 2 in a launch "
        "config) raises ImportError on torch < 2.6: a job that uses it already needs torch >= 2.6.",
        since="1.7.0",
        read="accelerate v1.6.0 utils/constants.py (FSDP2_PYTORCH_VERSION = \"2.5.1\"), v1.7.0 and 1.15.0 "
             "(\"2.6.0\"); 1.15.0 utils/dataclasses.py and accelerator.py raise for fsdp_version == 2 below it",
        since_read=('1.6.0', '1.7.0'),
        check='python bench/facts/release_bisect.py accelerate accelerate/utils/constants.py --regex \'FSDP2_PYTORCH_VERSION = "2.6\'',
    ),
    Behaviour(
        "trl_needs_transformers_4", "trl",
        "trl releases before 0.29 do not import their trainers with transformers >= 5.3 (`from trl import "
        "SFTTrainer, DPOTrainer, GRPOTrainer` raises): trl/import_utils.py reads transformers' "
        "`_is_package_available(name)` as a bool, and from transformers 5.3.0 it returns a (bool, version) tuple, so "
        "every optional package looks installed (ModuleNotFoundError: weave, mergekit, ...); releases that import "
        "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES (trl/trainer/dpo_trainer.py up to 0.2x) fail on any transformers 5 "
        "(removed in 5.0.0). A project on such a trl runs transformers 4 (or 5.0-5.2).",
        since=None, until="0.29.0",
        read="measured with transformers 5.24.0 (bench/facts/release_run.py, each trl release installed over the "
             "shared stack): 0.15.2, 0.16.0 and 0.22.1 raise ImportError: cannot import name "
             "'MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES'; 0.26.1, 0.27.2 and 0.28.0 raise ModuleNotFoundError: No module "
             "named 'weave'; 0.29.0 imports (it defines its own _is_package_available). Read: transformers 5.2.0 and "
             "5.3.0 utils/import_utils.py (`return package_exists` -> `return package_exists, None`); 4.57.6 and "
             "5.0.0 models/auto/modeling_auto.py (MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES removed)",
        unverified="measured with transformers 5.24.0 only; trl 0.28 with transformers 5.0-5.2 was not run",
        until_read=("0.28.0", "0.29.0"),
        check="python bench/facts/release_run.py trl --code 'from trl import SFTTrainer, DPOTrainer, GRPOTrainer' "
              "--from 0.15.0 --to 0.29.0 --with requests --with urllib3 --with charset_normalizer --with certifi",
    ),
    Behaviour(
        "trl_trainer_injects_lora", "trl",
        "trl's trainers given `peft_config=` (and a model that is not a PeftModel yet) call get_peft_model "
        "on it in __init__: the trainer's model is the PEFT model, with LoRA injected into the given model.",
        since=None,
        read="trl v0.8.0, v0.15.2 and v1.5.0 trainer/sft_trainer.py, dpo_trainer.py, reward_trainer.py; "
             "kto_trainer.py (v0.8.0, v0.15.2); grpo_trainer.py (v0.15.2, v1.5.0): `model = "
             "get_peft_model(model, peft_config)` when peft_config is given",
        unverified="releases between those read; SFTTrainer 0.15.2 passes autocast_adapter_dtype=False for "
                   "some models, so no adapter dtype is claimed here",
    ),
    Behaviour(
        "trl_value_head_injects_lora", "trl",
        "trl's value-head models (AutoModelForCausalLMWithValueHead / AutoModelForSeq2SeqLMWithValueHead) given "
        "`peft_config=` in from_pretrained call get_peft_model on the model they load: the wrapped model is "
        "the PEFT model, with frozen base weights and trainable LoRA weights.",
        since=None,  # from trl 0.4.2 (0.4.1 has none), older than any release fsdplint covers
        read="trl v0.4.1 models/modeling_base.py (no get_peft_model), v0.4.2, v0.8.0, v0.20.0, v0.26.2 (same file) "
             "and v0.27.0, v0.29.0, v1.0.0, v1.9.0 experimental/ppo/modeling_value_head.py (`pretrained_model = "
             "get_peft_model(pretrained_model, peft_config)`)",
    ),
    Behaviour(
        "trl_value_head_prepares_kbit", "trl",
        "trl's value-head from_pretrained given `peft_config=` and a 4-/8-bit load runs peft's "
        "prepare_model_for_int8_training (later prepare_model_for_kbit_training) before get_peft_model: "
        "input gradients are enabled for checkpointing and the non-quantized parameters upcast to float32.",
        since=None,  # from trl 0.4.2 (0.4.1 has none), older than any release fsdplint covers
        read="trl v0.4.1 models/modeling_base.py (absent), v0.4.2 (`prepare_model_for_int8_training(pretrained_model, "
             "**peft_quantization_kwargs)`), v0.8.0, v0.26.2 and v0.27.0, v0.29.0, v1.9.0 "
             "experimental/ppo/modeling_value_head.py (`prepare_model_for_kbit_training`)",
    ),
    Behaviour(
        "from_pretrained_legacy_kbit", "transformers",
        "from_pretrained(..., load_in_4bit=True) / load_in_8bit=True (without quantization_config) builds "
        "BitsAndBytesConfig.from_dict({load_in_4bit, load_in_8bit}) plus any bnb_4bit_* keyword passed along: "
        "a 4-bit model without bnb_4bit_quant_storage stores its weights as uint8.",
        since=None, until="5.0.0",
        read="transformers 4.57.6 modeling_utils.py from_pretrained (`load_in_4bit = kwargs.pop(\"load_in_4bit\", "
             "False)`), 5.0.0 and 5.24.0 (no load_in_4bit / load_in_8bit keyword left)",
        until_read=("4.57.6", "5.0.0"),
        check="python bench/facts/release_bisect.py transformers transformers/modeling_utils.py --regex "
              "'kwargs\\.pop\\(\"load_in_4bit\"' --until --from 4.50.0",
    ),
    Behaviour(
        "trl_dpo_prepares_kbit", "trl",
        "DPOTrainer given peft_config and a 4-/8-bit model (is_loaded_in_4bit / is_loaded_in_8bit) runs "
        "peft's prepare_model_for_kbit_training on it before get_peft_model: the non-quantized parameters "
        "are upcast to float32.",
        since=None, until="0.29.0",
        read="trl v0.7.11, v0.8.0, v0.15.2, v0.19.0, v0.22.0, v0.25.0, v0.27.0, v0.28.0 trainer/dpo_trainer.py "
             "(present); v0.29.0, v1.0.0 (absent)",
        unverified="releases before 0.7.11 were not read",
        until_read=('0.28.0', '0.29.0'),
        check="python bench/facts/release_bisect.py trl trl/trainer/dpo_trainer.py --regex 'prepare_model_for_kbit_training\\(' --until",
    ),
    Behaviour(
        "from_pretrained_distributed_fsdp", "transformers",
        "from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=N)) with N (times "
        "dp_replicate_size) > 1 applies FSDP2 fully_shard to the model inside from_pretrained "
        "(maybe_distribute_model -> apply_fully_sharded_data_parallelism): the returned model is sharded.",
        since=None,
        read="transformers 5.24.0 modeling_utils.py (from_pretrained pops distributed_config, "
             "maybe_distribute_model), distributed/configuration_utils.py (fsdp_size, dp_replicate_size: "
             "\"Applied only when dp_replicate_size * fsdp_size > 1\"), distributed/fsdp.py (fully_shard)",
        unverified="releases before 5.24 were not read; the keyword exists only in releases that shard with it, "
                   "so code that passes it needs no version check",
    ),
    # -- trl's get_quantization_config(model_args): the 4-bit storage of the config it returns -------
    Behaviour(
        "trl_quant_config_no_storage", "trl",
        "get_quantization_config(model_args) builds BitsAndBytesConfig(load_in_4bit=True, compute dtype, quant "
        "type, double quant) without bnb_4bit_quant_storage: 4-bit weights stored as uint8.",
        since=None, until="0.10.0",
        read="trl v0.7.11, v0.8.6, v0.9.4, v0.9.6 trl/trainer/utils.py; trl#1863 (the fix) is first in v0.10",
        until_read=('0.9.6', '0.10.1'),
        check='python bench/facts/release_bisect.py trl trl/trainer/utils.py --regex bnb_4bit_quant_storage',
    ),
    Behaviour(
        "trl_quant_config_storage_torch_dtype", "trl",
        "get_quantization_config sets bnb_4bit_quant_storage=model_args.torch_dtype (the load dtype).",
        since="0.10.0", until="0.23.0",
        read="trl v0.10.1, v0.11.0, v0.15.2, v0.19.0, v0.22.0 trl/trainer/utils.py",
        since_read=('0.9.6', '0.10.1'),
        check="python bench/facts/release_bisect.py trl trl/trainer/utils.py --regex 'bnb_4bit_quant_storage=model_args.torch_dtype'",
        until_read=('0.22.2', '0.23.0'),
    ),
    Behaviour(
        "trl_quant_config_storage_dtype", "trl",
        "get_quantization_config sets bnb_4bit_quant_storage=model_args.dtype (the load dtype).",
        since="0.23.0", until="0.26.0",
        read="trl v0.23.0, v0.25.0 trl/trainer/utils.py",
        unverified="",
        since_read=('0.22.2', '0.23.0'),
        until_read=('0.25.1', '0.26.0'),
        check="python bench/facts/release_bisect.py trl trl/trainer/utils.py --regex 'bnb_4bit_quant_storage=model_args.dtype'",
    ),
    Behaviour(
        "trl_quant_config_storage_field", "trl",
        "get_quantization_config sets bnb_4bit_quant_storage=model_args.bnb_4bit_quant_storage, a ModelConfig "
        "field whose default is None (uint8 storage unless --bnb_4bit_quant_storage is given).",
        since="0.26.0",
        read="trl v0.26.0, v0.27.0, v0.29.0, v1.0.0 trl/trainer/utils.py; v1.5.0 utils.py and model_config.py (default None)",
        since_read=('0.25.1', '0.26.0'),
        check="python bench/facts/release_bisect.py trl trl/trainer/utils.py --regex 'bnb_4bit_quant_storage=model_args.bnb_4bit_quant_storage'",
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
        since_read=('4.35.2', '4.36.0'),
        check="python bench/facts/release_bisect.py transformers transformers/cache_utils.py --regex 'class DynamicCache'",
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
        since_read=('2.0.9.post0', '2.1.0'),
        check='python bench/facts/release_bisect.py lightning lightning/fabric/strategies/fsdp.py --regex \'setdefault\\("use_orig_params", True\\)\'',
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
        since_read=('2.0.9.post0', '2.1.0'),
        check="python bench/facts/release_bisect.py lightning lightning/pytorch/strategies/fsdp.py --regex 'def lightning_module_state_dict'",
    ),
    Behaviour(
        "lightning_trainer_fsdp_is_torch", "lightning",
        "Trainer(strategy=\"fsdp\") is torch's FullyShardedDataParallel (FSDPStrategy); before 2.0 the torch "
        "strategy was strategy=\"fsdp_native\" and \"fsdp\" meant FairScale's DDPFullyShardedStrategy.",
        since="2.0.0",
        read="Lightning 1.8.6 and 1.9.5 pytorch_lightning/strategies/fully_sharded.py (\"fsdp\": FairScale) and "
             "fully_sharded_native.py (\"fsdp_native\", \"fsdp_native_full_shard_offload\"); 2.0.0 CHANGELOG "
             "(\"strategy=\\\"fsdp_native\\\" is now strategy=\\\"fsdp\\\"\"); lightning_fabric 1.9.5 registers \"fsdp\" "
             "and \"fsdp_full_shard_offload\" for torch FSDP; lightning 1.9.5 and 2.0.0 wheels "
             "lightning/pytorch/strategies/: 1.9.5 registers \"fsdp\" in fully_sharded.py (FairScale), 2.0.0 in fsdp.py "
             "(FSDPStrategy)",
        since_read=("1.9.5", "2.0.0"),
        check="python bench/facts/release_bisect.py lightning lightning/pytorch/strategies/fsdp.py --regex "
              "'register\\(\\s*\"fsdp\",' --from 1.9.0 --to 2.1.0",
    ),
    # -- training tools (axolotl, LLaMA-Factory): what the tool builds from its config --------------
    Behaviour(
        "axolotl_qlora_fsdp_storage", "axolotl",
        "`adapter: qlora` + `load_in_4bit` builds BitsAndBytesConfig(bnb_4bit_quant_storage=torch.bfloat16)",
        since="0.5.0",
        before="no bnb_4bit_quant_storage (uint8)",
        read="axolotl v0.4.0 src/axolotl/utils/models.py (no bnb_4bit_quant_storage), v0.5.0 (present), v0.18.0 "
             "src/axolotl/loaders/model.py (set_quantization_config)",
        since_read=("0.4.0", "0.5.0"),
        check="python bench/facts/release_bisect.py axolotl src/axolotl/utils/models.py,src/axolotl/loaders/model.py "
              "--regex bnb_4bit_quant_storage --mirror AXOLOTL_GIT_DIR (the release tags; v0.4.0 is not on the "
              "package index)",
    ),
    Behaviour(
        "axolotl_lora_4bit_ignored", "axolotl",
        "`adapter: lora` + `load_in_4bit` builds no 4-bit config (only `adapter: qlora` quantizes to 4 bits)",
        since="0.13.0",
        before="`adapter: lora` + `load_in_4bit` passed load_in_4bit=True to from_pretrained (uint8 storage)",
        read="axolotl v0.12.0 and v0.12.2 loaders/model.py (`model_kwargs[\"load_in_4bit\"] = cfg.load_in_4bit`), "
             "v0.13.0 (removed)",
        since_read=("0.12.2", "0.13.0"),
        check="python bench/facts/release_bisect.py axolotl src/axolotl/utils/models.py,src/axolotl/loaders/model.py "
              "--regex 'model_kwargs\\[\"load_in_4bit\"\\] = ' --until --from 0.9.0 --mirror AXOLOTL_GIT_DIR (the "
              "release tags; v0.13.0 is not on the package index)",
    ),
    Behaviour(
        "axolotl_fsdp2_4bit_patch", "axolotl",
        "with fsdp_version 2 and `adapter: qlora`, axolotl patches FSDP2's FSDPParam to keep Params4bit",
        since="0.12.0",
        before="no FSDP2 support for Params4bit",
        read="axolotl#2992; v0.12.0 src/axolotl/monkeypatch/fsdp2_qlora.py, loaders/patch_manager.py",
        since_read=('0.11.0', '0.12.0'),
        check='python bench/facts/release_bisect.py axolotl axolotl/monkeypatch/fsdp2_qlora.py --regex Params4bit',
    ),
    Behaviour(
        "axolotl_fsdp2_8bit_patch", "axolotl",
        "with fsdp_version 2 and load_in_8bit, axolotl patches FSDP2 to keep Int8Params",
        since="0.15.0",
        before="no FSDP2 support for Int8Params",
        read="axolotl v0.15.0 loaders/patch_manager.py `_apply_fsdp2_bnb_patches` (load_in_4bit or load_in_8bit)",
        since_read=('0.14.0', '0.15.0'),
        check='python bench/facts/release_bisect.py axolotl axolotl/loaders/patch_manager.py --regex load_in_8bit',
    ),
    Behaviour(
        "axolotl_fsdp_device_map", "axolotl",
        "under FSDP axolotl drops the config's device_map (\"FSDP requires control over device placement\")",
        since="0.12.0",
        before="the config's device_map was passed to from_pretrained",
        read="axolotl v0.12.0 loaders/model.py `_set_device_map_config`",
        since_read=('0.11.0', '0.12.0'),
        check="python bench/facts/release_bisect.py axolotl axolotl/loaders/model.py --regex 'FSDP requires control over device placement'",
    ),
    Behaviour(
        "llamafactory_fsdp_bnb_check", "llamafactory",
        "under FSDP LLaMA-Factory requires transformers>=4.39.0 and bitsandbytes>=0.43.0 itself (ImportError)",
        since="0.7.1",
        before="only under DeepSpeed ZeRO-3; under FSDP an older transformers/bitsandbytes silently keeps uint8 storage",
        read="LLaMA-Factory v0.6.3 src/llmtuner/model/patcher.py and v0.7.0 src/llmtuner/model/utils/quantization.py "
             "(`if is_deepspeed_zero3_enabled() or model_args.quantization_device_map == \"auto\"`: no FSDP); v0.7.1 "
             "(`... or is_fsdp_enabled() or ...`: require_version(\"transformers>=4.39.0\"), (\"bitsandbytes>=0.43.0\"); "
             "commit d4d36e157 \"fix fsdp model loading\"), v0.8.0-v0.9.5 src/llamafactory/model/model_utils/quantization.py",
        since_read=("0.7.0", "0.7.1"),
        check="python bench/facts/release_bisect.py llamafactory src/llamafactory/model/model_utils/quantization.py,"
              "src/llmtuner/model/utils/quantization.py,src/llmtuner/model/patcher.py --regex 'is_fsdp_enabled\\(\\) or' "
              "--from 0.5.0 --mirror LLAMA_FACTORY_GIT_DIR (the release tags)",
    ),
    Behaviour(
        "llamafactory_fsdp_8bit_refused", "llamafactory",
        "8-bit under FSDP raises ValueError itself (\"Only 4-bit quantized model can use auto device map.\" "
        "from 0.7.1, \"Only 4-bit quantized model can use fsdp+qlora or auto device map.\" from 0.8.2)",
        since="0.7.1",
        before="8-bit under FSDP reached FSDP's flattening",
        read="LLaMA-Factory v0.7.0 src/llmtuner/model/utils/quantization.py (the 4-bit check only under ZeRO-3 or "
             "an auto device map), v0.7.1 (`... or is_fsdp_enabled() or ...`: `if model_args.quantization_bit != 4: "
             "raise ValueError(\"Only 4-bit quantized model can use auto device map.\")`); v0.8.1 and v0.8.2 "
             "src/llamafactory/model/model_utils/quantization.py (the message names fsdp+qlora from v0.8.2, commit "
             "60d9896a7)",
        since_read=("0.7.0", "0.7.1"),
        check="python bench/facts/release_bisect.py llamafactory src/llamafactory/model/model_utils/quantization.py,"
              "src/llmtuner/model/utils/quantization.py,src/llmtuner/model/patcher.py --regex 'is_fsdp_enabled\\(\\) or' "
              "--from 0.5.0 --mirror LLAMA_FACTORY_GIT_DIR (the release tags; the same block raises for 8 bits)",
    ),
    Behaviour(
        "trainer_callback_gets_model", "transformers",
        "Every TrainerCallback event (`on_save`, `on_step_end`, ... see TRAINER_CALLBACK_EVENTS) is called on "
        "every rank with `model=` the Trainer's own model: under FSDP the module FSDP shards (FSDP1 wraps it in "
        "place as the root's inner module with sharded units inside, or the root wrapper itself in 4.x; FSDP2 "
        "shards it in place), so a callback that saves or reads its parameters reads this rank's shards.",
        since=None,
        read="transformers 5.24.0 trainer_callback.py (CallbackHandler.call_event: `model=self.model`) and "
             "trainer.py (CallbackHandler(callbacks, self.model, ...) in __init__; `self.model = "
             "self.model_wrapped = model` after accelerator.prepare under FSDP); a 4.x trainer.py "
             "_inner_training_loop (\"Update the references\": `self.callback_handler.model = self.model`)",
        unverified="the 4.x trainer.py read had no version number",
    ),
    Behaviour(
        "peft_leaf_safe_toggles", "peft",
        "peft's adapter toggles (set_adapter, enable/disable_adapter_layers, disable_adapter()) set requires_grad "
        "on leaf tensors only and skip the rest, so inside an FSDP1 use_orig_params=True unit's forward (non-leaf "
        "views) they no longer raise; the user's own `p.requires_grad = ...` there still does.",
        since="0.19.0",
        before="the toggles call `layer.requires_grad_(...)` on every adapter module, which raises \"you can only "
               "change requires_grad flags of leaf variables\" on the views of a running FSDP1 unit",
        read="peft 0.21.2 src/peft/utils/other.py `_set_layer_requires_grad` (peft#3001, commit 8695f0f); peft "
             "0.15.2 src/peft/tuners/tuners_utils.py (`layer.requires_grad_(...)` in enable_adapters/set_adapter)",
        unverified="",
        since_read=('0.18.1', '0.19.0'),
        check="python bench/facts/release_bisect.py peft peft/utils/other.py --regex 'def _set_layer_requires_grad'",
    ),
    Behaviour(
        "trl_ref_adapter_under_no_grad", "trl",
        "with ref_model=None and a PEFT model, DPOTrainer computes the reference log-probs with the policy's "
        "adapters switched (disable_adapter(), or set_adapter to ref_adapter_name / the \"ref\" adapter and back), "
        "outside the model's forward and under torch.no_grad(): on FSDP1 (both use_orig_params settings) and "
        "FSDP2 this only changes which adapter the next forward uses (measured harmless, FSDP114).",
        since=None,
        read="trl v0.15.0, v0.17.0, v0.20.0 trainer/dpo_trainer.py (`null_ref_context` inside `with torch.no_grad()` "
             "of `compute_ref_log_probs`: `self.model.set_adapter(self.ref_adapter_name)` / "
             "`unwrap_model(self.model).disable_adapter()`); v0.29.0 and v1.9.0 (`use_adapter(unwrapped_model, ...)` "
             "under `torch.no_grad()`, trainer/utils.py)",
        unverified="trl releases before 0.15.0 were not read",
    ),
)}

# The TrainerCallback methods CallbackHandler calls with the Trainer's model (transformers 5.24.0
# trainer_callback.py, class TrainerCallback): `trainer_callback_gets_model`.
TRAINER_CALLBACK_EVENTS = frozenset({
    "on_init_end", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_step_begin",
    "on_pre_optimizer_step", "on_optimizer_step", "on_substep_end", "on_step_end", "on_evaluate", "on_predict",
    "on_save", "on_log", "on_prediction_step", "on_push_begin",
})


# A known version of one package that rules out the *installed* version of another: the environment
# fsdplint runs in is then not the project's (behaviour key, the package it constrains, its first
# excluded release).
EXCLUDES: tuple[tuple[str, str, str], ...] = (
    ("trl_needs_transformers_4", "transformers", "5.3"),
)


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
        if _checkout_between(target, b.since_read):
            return None
        return False
    if b.until is not None and v >= Version(b.until):
        return False
    if b.until is not None and _checkout_between(target, b.until_read):
        return None
    return True


def _checkout_between(target, pair) -> bool:
    """A library's own source tree that says it is the release just before a boundary (the first of the two
    adjacent releases read): any commit after that release carries the same number until the next one is
    tagged, so the tree may hold the change or not. (A tree that says an older release cannot: the change
    was not in the release after it either.)"""
    if getattr(target, "kind", "") != "checkout" or len(pair) != 2:
        return False
    try:
        return Version(pair[0]) == Version(target.version.base_version)
    except InvalidVersion:
        return False


def unverified(key: str, target) -> str:
    """Why the answer `holds(key, target)` gives is not established, "" when it is (or when the version is
    unknown, which callers already handle). The answer rests on every boundary that, moved past the target
    version, would flip it: `since` for a False below it, `until` for a False from it on, both for a True. A
    boundary whose two adjacent releases were not read (`since_read` / `until_read` empty) is unverified,
    and a finding that rests on it is a warning that says so (LintContext.report(rests_on=...))."""
    b = BEHAVIOURS[key]
    answer = holds(key, target)
    if answer is None:
        return ""
    v: Version = target.version
    rests = []
    if b.since is not None and (answer or v < Version(b.since)):
        rests.append(("since", b.since, b.since_read))
    if b.until is not None and (answer or v >= Version(b.until)):
        rests.append(("until", b.until, b.until_read))
    open_ = [f"{name} {bound}" for name, bound, pair in rests if len(pair) != 2]
    if not open_:
        return ""
    return (f"boundary unverified: {b.package} {' and '.join(open_)} ({key}) was not read at two adjacent "
            f"releases" + (f"; {b.unverified}" if b.unverified else ""))


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

def excluded_installed(package: str, installed, version_of) -> Optional[str]:
    """Why the installed `package` (a versions.TargetVersion of kind "installed") cannot be the project's,
    when a known version of another package (`version_of(name)`) rules it out (EXCLUDES); else None."""
    for key, constrained, first in EXCLUDES:
        if constrained != package or installed.version < Version(first):
            continue
        other = version_of(BEHAVIOURS[key].package)
        if other.known and other.kind != "installed" and holds(key, other) is True:
            return (f"the installed {package} {installed.version} is not the project's: "
                    f"{other.describe()} does not import with {package} >= {first}")
    return None
