"""What fsdplint knows about the libraries' APIs, kept as data.

Each entry maps an API id (used by the analysis and the rules) to the fully
qualified names under which that object can be imported. The resolver turns
any import style (`from x import y as z`, `import x.y as m; m.z`) into such a
name, so aliased imports match.
"""

from __future__ import annotations

from dataclasses import dataclass

_FSDP1 = "torch.distributed.fsdp"

QUALIFIED: dict[str, tuple[str, ...]] = {
    # --- torch FSDP ---
    "fully_shard": (
        "torch.distributed.fsdp.fully_shard",
        "torch.distributed.fsdp._fully_shard.fully_shard",
        "torch.distributed.fsdp._fully_shard._fully_shard.fully_shard",
        "torch.distributed._composable.fsdp.fully_shard",
        "torch.distributed._composable.fsdp.fully_shard.fully_shard",
        "torch.distributed._composable.fully_shard",
    ),
    "FSDP1": (
        f"{_FSDP1}.FullyShardedDataParallel",
        f"{_FSDP1}.fully_sharded_data_parallel.FullyShardedDataParallel",
    ),
    "DDP": (
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
        "torch.nn.parallel.DDP",
    ),
    "FSDPModule": ("torch.distributed.fsdp.FSDPModule", "torch.distributed._composable.fsdp.FSDPModule"),
    "MixedPrecisionPolicy": (
        "torch.distributed.fsdp.MixedPrecisionPolicy",
        "torch.distributed._composable.fsdp.MixedPrecisionPolicy",
    ),
    "register_fsdp_forward_method": (
        "torch.distributed.fsdp.register_fsdp_forward_method",
        "torch.distributed._composable.fsdp.register_fsdp_forward_method",
    ),
    "StateDictType": (f"{_FSDP1}.StateDictType", f"{_FSDP1}.api.StateDictType"),
    "FullStateDictConfig": (f"{_FSDP1}.FullStateDictConfig", f"{_FSDP1}.api.FullStateDictConfig"),
    "transformer_auto_wrap_policy": (f"{_FSDP1}.wrap.transformer_auto_wrap_policy",),
    "size_based_auto_wrap_policy": (f"{_FSDP1}.wrap.size_based_auto_wrap_policy",),
    "lambda_auto_wrap_policy": (f"{_FSDP1}.wrap.lambda_auto_wrap_policy",),
    "ModuleWrapPolicy": (f"{_FSDP1}.wrap.ModuleWrapPolicy",),
    "CustomPolicy": (f"{_FSDP1}.wrap.CustomPolicy",),
    # Manual FSDP1 wrapping of submodules: `with enable_wrap(wrapper_cls=FSDP): wrap(layer)`.
    "fsdp_wrap": (f"{_FSDP1}.wrap.wrap",),
    "enable_wrap": (f"{_FSDP1}.wrap.enable_wrap",),
    "functools_partial": ("functools.partial",),
    "init_process_group": (
        "torch.distributed.init_process_group",
        "torch.distributed.distributed_c10d.init_process_group",
    ),
    "get_rank": ("torch.distributed.get_rank", "torch.distributed.distributed_c10d.get_rank"),
    "cuda_set_device": (
        "torch.cuda.set_device",
        "torch.accelerator.set_device_index",
        "torch.accelerator.set_device_idx",
        "torch.xpu.set_device",
        "torch.npu.set_device",
    ),
    "init_device_mesh": (
        "torch.distributed.device_mesh.init_device_mesh",
        "torch.distributed._tensor.device_mesh.init_device_mesh",
        "torch.distributed.init_device_mesh",
    ),
    "clip_grad_norm_": ("torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_norm_"),
    # torch 2.13 nn/utils/clip_grad.py: clip_grad_norm_ is get_total_norm(grads) followed by
    # clip_grads_with_norm_(params, max_norm, total_norm); the norm is the same value either way.
    "get_total_norm": ("torch.nn.utils.get_total_norm", "torch.nn.utils.clip_grad.get_total_norm",
                       "torch.nn.utils.clip_grad._get_total_norm"),
    "torch_save": ("torch.save",),
    "torch_compile": ("torch.compile",),
    "apply_activation_checkpointing": (
        "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing",
    ),
    "checkpoint_wrapper": (
        "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper",
        "torch.distributed._composable.checkpoint_activation.checkpoint",
        "torch.distributed._composable.checkpoint",
    ),
    "nn_Parameter": ("torch.nn.Parameter", "torch.nn.parameter.Parameter"),
    "nn_ParameterList": (
        "torch.nn.ParameterList", "torch.nn.ParameterDict",
        "torch.nn.modules.container.ParameterList", "torch.nn.modules.container.ParameterDict",
    ),
    "get_model_state_dict": (
        "torch.distributed.checkpoint.state_dict.get_model_state_dict",
        "torch.distributed.checkpoint.state_dict.get_state_dict",
    ),
    # --- peft ---
    "get_peft_model": ("peft.get_peft_model", "peft.mapping.get_peft_model", "peft.mapping_func.get_peft_model"),
    "inject_adapter_in_model": ("peft.inject_adapter_in_model", "peft.mapping.inject_adapter_in_model"),
    "PeftModel_from_pretrained": (
        "peft.PeftModel.from_pretrained",
        "peft.peft_model.PeftModel.from_pretrained",
        "peft.AutoPeftModelForCausalLM.from_pretrained",
    ),
    "LoraConfig": ("peft.LoraConfig", "peft.tuners.lora.LoraConfig", "peft.tuners.lora.config.LoraConfig"),
    "prepare_model_for_kbit_training": (
        "peft.prepare_model_for_kbit_training",
        "peft.utils.prepare_model_for_kbit_training",
        "peft.utils.other.prepare_model_for_kbit_training",
    ),
    "peft_fsdp_auto_wrap_policy": ("peft.utils.other.fsdp_auto_wrap_policy", "peft.utils.fsdp_auto_wrap_policy"),
    "get_peft_model_state_dict": (
        "peft.get_peft_model_state_dict",
        "peft.utils.get_peft_model_state_dict",
        "peft.utils.save_and_load.get_peft_model_state_dict",
    ),
    # --- transformers / trl / accelerate / bitsandbytes ---
    "BitsAndBytesConfig": (
        "transformers.BitsAndBytesConfig",
        "transformers.utils.quantization_config.BitsAndBytesConfig",
    ),
    # the trl function that builds a BitsAndBytesConfig from its ModelConfig (see RETURNED_CONFIGS).
    "trl_get_quantization_config": (
        "trl.get_quantization_config",
        "trl.trainer.get_quantization_config",
        "trl.trainer.utils.get_quantization_config",
    ),
    "TrainingArguments": (
        "transformers.TrainingArguments",
        "transformers.training_args.TrainingArguments",
        "transformers.Seq2SeqTrainingArguments",
        "trl.SFTConfig",
        "trl.DPOConfig",
        "trl.GRPOConfig",
        "trl.trainer.sft_config.SFTConfig",
    ),
    "Trainer": ("transformers.Trainer", "transformers.trainer.Trainer", "trl.SFTTrainer", "trl.DPOTrainer", "trl.GRPOTrainer"),
    # Composer's Trainer wraps the model with FSDP1 in its __init__ when given `fsdp_config=` (composer
    # v0.14-v0.22 trainer/dist_strategy.py prepare_fsdp_module; later releases distributed/dist_strategy.py).
    "composer_Trainer": ("composer.Trainer", "composer.trainer.Trainer", "composer.trainer.trainer.Trainer"),
    "composer_HuggingFaceModel": ("composer.models.HuggingFaceModel", "composer.models.huggingface.HuggingFaceModel"),
    "DistributedConfig": (
        "transformers.DistributedConfig",
        "transformers.distributed.DistributedConfig",
        "transformers.distributed.configuration_utils.DistributedConfig",
    ),
    "Accelerator": ("accelerate.Accelerator", "accelerate.accelerator.Accelerator"),
    "DistributedDataParallelKwargs": (
        "accelerate.DistributedDataParallelKwargs",
        "accelerate.utils.DistributedDataParallelKwargs",
        "accelerate.utils.dataclasses.DistributedDataParallelKwargs",
    ),
    # --- Lightning: FSDP chosen as the Fabric / Trainer strategy ---
    # (Lightning 1.x: the Trainer's torch FSDP strategy was DDPFullyShardedNativeStrategy, "fsdp_native".)
    "lightning_FSDPStrategy": (
        "lightning.fabric.strategies.FSDPStrategy",
        "lightning.fabric.strategies.fsdp.FSDPStrategy",
        "lightning.pytorch.strategies.FSDPStrategy",
        "lightning.pytorch.strategies.fsdp.FSDPStrategy",
        "lightning_fabric.strategies.FSDPStrategy",
        "lightning_fabric.strategies.fsdp.FSDPStrategy",
        "pytorch_lightning.strategies.FSDPStrategy",
        "pytorch_lightning.strategies.fsdp.FSDPStrategy",
        "pytorch_lightning.strategies.DDPFullyShardedNativeStrategy",
        "pytorch_lightning.strategies.fully_sharded_native.DDPFullyShardedNativeStrategy",
    ),
    "lightning_Fabric": (
        "lightning.Fabric", "lightning.fabric.Fabric", "lightning.fabric.fabric.Fabric",
        "lightning_fabric.Fabric", "lightning_fabric.fabric.Fabric",
    ),
    "lightning_Trainer": (
        "lightning.Trainer", "lightning.pytorch.Trainer", "lightning.pytorch.trainer.trainer.Trainer",
        "pytorch_lightning.Trainer", "pytorch_lightning.trainer.trainer.Trainer",
    ),
    "lightning_LightningModule": (
        "lightning.LightningModule", "lightning.pytorch.LightningModule", "lightning.pytorch.core.LightningModule",
        "lightning.pytorch.core.module.LightningModule", "pytorch_lightning.LightningModule",
        "pytorch_lightning.core.LightningModule", "pytorch_lightning.core.module.LightningModule",
        "pytorch_lightning.core.lightning.LightningModule",
    ),
    "lightning_ModelCheckpoint": (
        "lightning.pytorch.callbacks.ModelCheckpoint", "lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint",
        "pytorch_lightning.callbacks.ModelCheckpoint", "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint",
    ),
    # loralib's (and lit-llama's / litgpt's) freeze of every non-LoRA parameter.
    "mark_only_lora_as_trainable": (
        "loralib.mark_only_lora_as_trainable",
        "loralib.utils.mark_only_lora_as_trainable",
        "lit_llama.lora.mark_only_lora_as_trainable",
        "lit_gpt.lora.mark_only_lora_as_trainable",
        "litgpt.lora.mark_only_lora_as_trainable",
    ),
    "FullyShardedDataParallelPlugin": (
        "accelerate.FullyShardedDataParallelPlugin",
        "accelerate.utils.FullyShardedDataParallelPlugin",
        "accelerate.utils.dataclasses.FullyShardedDataParallelPlugin",
    ),
}

# Prefixes whose calls build an optimizer over the given params.
OPTIMIZER_PREFIXES = ("torch.optim.", "bitsandbytes.optim.", "transformers.optimization.", "torchao.optim.")
OPTIMIZER_EXCLUDE = ("torch.optim.lr_scheduler.", "torch.optim.swa_utils.")

# Modules whose `X.from_pretrained` / `X.from_config` load a model. trl's value-head wrappers (PPO) pass their
# keywords on to the transformers class they wrap (`load_in_8bit=`, `device_map=`, `quantization_config=`):
# trl v0.4.2 to v1.9.0 PreTrainedModelWrapper.from_pretrained (`cls.transformers_parent_class.from_pretrained(...,
# **pretrained_kwargs)`), exported as trl.X up to v0.28.0 and from trl.experimental.ppo since v0.24.0.
VALUE_HEAD_LOADERS = ("AutoModelForCausalLMWithValueHead", "AutoModelForSeq2SeqLMWithValueHead")
MODEL_LOADER_PREFIXES = ("transformers.", "peft.AutoPeftModel") + tuple(
    f"{m}.{c}" for m in ("trl", "trl.models", "trl.models.modeling_value_head", "trl.experimental.ppo",
                         "trl.experimental.ppo.modeling_value_head") for c in VALUE_HEAD_LOADERS)
MODEL_LOADER_METHODS = ("from_pretrained", "from_config")

# Names that the analysis and the pre-filter look for; a file mentioning none is skipped.
TRIGGER_WORDS = (
    "fsdp", "FSDP", "fully_shard", "FullyShard", "peft", "lora", "Lora", "LoRA",
    "bitsandbytes", "BitsAndBytes", "load_in_4bit", "load_in_8bit", "accelerate", "Accelerator",
    "gradient_checkpointing", "Trainer", "TrainingArguments", "SFTConfig", "DPOConfig", "GRPOConfig",
    "DistributedDataParallel", "init_process_group", "clip_grad_norm_", "device_mesh",
)

_BY_NAME: dict[str, str] = {q: api for api, names in QUALIFIED.items() for q in names}


def api_of(qualified: str | None) -> str | None:
    """The API id for a fully qualified name, or None."""
    if not qualified:
        return None
    api = _BY_NAME.get(qualified)
    if api:
        return api
    if qualified.startswith(OPTIMIZER_PREFIXES) and not qualified.startswith(OPTIMIZER_EXCLUDE):
        last = qualified.rsplit(".", 1)[-1]
        if last[:1].isupper() and "Scheduler" not in last and last not in ("Optimizer",):
            return "optimizer"
    head, _, method = qualified.rpartition(".")
    if method in MODEL_LOADER_METHODS and head.startswith(MODEL_LOADER_PREFIXES):
        cls = head.rsplit(".", 1)[-1]
        if "Config" not in cls and "Tokenizer" not in cls and "Processor" not in cls:
            return "load_model"
    return None


@dataclass(frozen=True)
class Boundary:
    """A release that added, moved or changed an API the rules gate on, with the two adjacent releases read
    (last without, first with) and the command that re-reads them. `read_at` empty: unverified."""

    package: str
    since: str
    what: str
    read_at: tuple[str, ...] = ()
    check: str = ""


# Releases the rules compare versions with; the constants below are what the rules import.
BOUNDARIES: dict[str, Boundary] = {
    "fully_shard_public_path": Boundary(
        "torch", "2.6",
        "torch.distributed.fsdp exports fully_shard, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, "
        "CPUOffloadPolicy, register_fsdp_forward_method and UnshardHandle, and FSDP2 lives in "
        "torch/distributed/fsdp/_fully_shard/ (before: torch.distributed._composable.fsdp only)",
        ("2.5.1", "2.6.0"),
        "python bench/facts/release_bisect.py torch torch/distributed/fsdp/__init__.py --regex '\\bfully_shard\\b' "
        "--from 2.4.0 --to 2.7.0"),
    "fully_shard_ignored_params": Boundary(
        "torch", "2.7",
        "fully_shard(..., ignored_params=...) exists (torch/distributed/fsdp/_fully_shard/_fully_shard.py)",
        ("2.6.0", "2.7.0"),
        "python bench/facts/release_bisect.py torch torch/distributed/fsdp/_fully_shard/_fully_shard.py --regex "
        "'ignored_params: Optional' --from 2.6.0 --to 2.8.0"),
    "fully_shard_root_reshard_respected": Boundary(
        "torch", "2.8",
        "the root's explicit reshard_after_forward=True is respected (_fsdp_state.py `_lazy_init`: `if "
        "self._fsdp_param_group and self._auto_reshard_after_forward:` before clearing post_forward_mesh_info; "
        "pytorch#154704)",
        ("2.7.1", "2.8.0"),
        "python bench/facts/release_bisect.py torch torch/distributed/fsdp/_fully_shard/_fsdp_state.py --regex "
        "'_fsdp_param_group and self._auto_reshard_after_forward' --from 2.7.0 --to 2.9.0"),
    "peft_target_parameters": Boundary(
        "peft", "0.17.0", "LoraConfig(target_parameters=...) exists (peft/tuners/lora/config.py)",
        ("0.16.0", "0.17.0"),
        "python bench/facts/release_bisect.py peft peft/tuners/lora/config.py --regex target_parameters --from 0.13.0"),
    "bnb_quant_storage": Boundary(
        "bitsandbytes", "0.43.0", "Params4bit / Linear4bit take quant_storage (bitsandbytes/nn/modules.py)",
        ("0.42.0", "0.43.0"),
        "python bench/facts/release_bisect.py bitsandbytes bitsandbytes/nn/modules.py --regex quant_storage "
        "--from 0.40.0 --to 0.45.0"),
    "transformers_non_reentrant_default": Boundary(
        "transformers", "5.0",
        "gradient_checkpointing_enable() without gradient_checkpointing_kwargs checkpoints non-reentrantly "
        "(modeling_utils.py no longer defaults to {\"use_reentrant\": True})",
        ("4.57.6", "5.0.0"),
        "python bench/facts/release_bisect.py transformers transformers/modeling_utils.py --regex "
        "'\"use_reentrant\": True' --until --from 4.50.0"),
}

# torch, peft and bitsandbytes releases that moved or added APIs (BOUNDARIES says what was read).
FULLY_SHARD_PUBLIC_PATH_SINCE = BOUNDARIES["fully_shard_public_path"].since   # torch.distributed.fsdp.fully_shard
FULLY_SHARD_IGNORED_PARAMS_SINCE = BOUNDARIES["fully_shard_ignored_params"].since
PEFT_TARGET_PARAMETERS_SINCE = BOUNDARIES["peft_target_parameters"].since
BNB_QUANT_STORAGE_SINCE = BOUNDARIES["bnb_quant_storage"].since

# Beyond TRIGGER_WORDS: words and called names in a project function that may load, move, save or
# transform a model, so its summary is worth computing when another module calls it (analysis/index.py).
# Every API of QUALIFIED counts by its last name too.
SUMMARY_WORDS = (
    "from_pretrained", "save_pretrained", "state_dict", "merge_and_unload", "merge_adapter", "optim.",
    "requires_grad", "torch.save", ".prepare(",
)
SUMMARY_CALLS = frozenset({
    "from_pretrained", "save_pretrained", "state_dict", "merge_and_unload", "merge_adapter", "generate",
    "add_adapter", "gradient_checkpointing_enable", "enable_input_require_grads", "clip_grad_norm_", "no_sync",
    "prepare", "unwrap_model", "get_state_dict", "save_state", "save_model", "requires_grad_", "to_empty",
})

# What a library call does to the model beyond its name, as facts attached to the call's event
# (`Event.data`), for rules and the version table (behaviour.py) to read. Per API id or method: the
# event kind it applies to, the fact, its value, and the keyword that turns it off (with the value that
# does). Each entry cites where the behaviour was read.
CALL_FACTS: dict[str, tuple[tuple[str, str, object, str, object, str], ...]] = {
    # peft 0.21.2 mapping_func.get_peft_model(autocast_adapter_dtype=True) -> BaseTuner._cast_adapter_dtype:
    # adapter weights of a float16/bfloat16 base are upcast to float32 ("Currently, this only upcasts
    # float16 and bfloat16 to float32"), so one FSDP1 flat parameter mixes dtypes.
    "get_peft_model": (("lora", "adapter_dtype", "float32", "autocast_adapter_dtype", False,
                        "peft/mapping_func.py get_peft_model; peft/tuners/tuners_utils.py _cast_adapter_dtype"),),
    # peft 0.21.2 PeftModel.from_pretrained(..., autocast_adapter_dtype=True): the same upcast on load.
    "PeftModel_from_pretrained": (("lora", "adapter_dtype", "float32", "autocast_adapter_dtype", False,
                                   "peft/peft_model.py PeftModel.from_pretrained"),),
}


# What a library call does to the model that its name does not say: the events the analysis adds at the
# call, as if the script had written them. Per API id (or qualified name): the event kind, which object it
# applies to ("result": what the call returns; "result.model": the returned trainer's model, the same
# model as the `model=` argument), the condition, and the behaviour entry (behaviour.py) that says from
# which version and where it was read. Conditions:
#   ("given", keyword): the keyword is passed, with a value that is not None;
#   ("product_gt_1", keyword, api, fields): the keyword is an `api(...)` call whose known int fields
#       multiply to more than 1 (a field left out counts 1; an unknown one: no effect);
#   ("quantized", keyword): the model passed (first argument or keyword) was loaded in 4 or 8 bits
#       (BitsAndBytesConfig or the legacy load_in_4bit/load_in_8bit keywords, known to be True);
#   ("all", cond, ...): every condition holds.
CALL_EFFECTS: dict[str, tuple[tuple[str, str, tuple, str], ...]] = {
    # from_pretrained(distributed_config=DistributedConfig(fsdp_size=N)) shards with fully_shard itself.
    "load_model": (("shard2", "result", ("product_gt_1", "distributed_config", "DistributedConfig",
                                         ("fsdp_size", "dp_replicate_size")),
                    "from_pretrained_distributed_fsdp"),),
    # trl's trainers given peft_config build the PEFT model themselves (get_peft_model in __init__).
    **{f"trl.{name}": (("lora", "result.model", ("given", "peft_config"), "trl_trainer_injects_lora"),)
       for name in ("SFTTrainer", "GRPOTrainer", "KTOTrainer", "RewardTrainer")},
    # trl's value-head `from_pretrained(..., peft_config=)` prepares a 4-/8-bit load for k-bit training and
    # injects LoRA into the model it loads (the value head sits outside the PEFT model).
    **{f"trl.{name}.from_pretrained": (
        ("kbit_prep", "result", ("all", ("given", "peft_config"), ("loads_quantized",)), "trl_value_head_prepares_kbit"),
        ("lora", "result", ("given", "peft_config"), "trl_value_head_injects_lora"),
    ) for name in VALUE_HEAD_LOADERS},
    # DPOTrainer also runs prepare_model_for_kbit_training first on a 4-/8-bit model (up to trl 0.28).
    "trl.DPOTrainer": (
        ("kbit_prep", "result.model", ("all", ("given", "peft_config"), ("quantized", "model")), "trl_dpo_prepares_kbit"),
        ("lora", "result.model", ("given", "peft_config"), "trl_trainer_injects_lora"),
    ),
}


# Library functions that build a config for the script, as the fields of the config they return, per
# release (behaviour.py keys in order; the first that holds for the target version applies). A field's
# source: ("arg_attr", name) is `<first argument>.name` at the call; ("absent",) is the field left out (the
# library default). Consumed by the rules that read those configs (FSDP202 for a 4-bit storage).
RETURNED_CONFIGS: dict[str, tuple[str, dict[str, tuple], tuple[tuple[str, dict[str, tuple]], ...]]] = {
    # trl/trainer/utils.py get_quantization_config(model_args) -> BitsAndBytesConfig | None
    "trl_get_quantization_config": (
        "BitsAndBytesConfig",
        {"load_in_4bit": ("arg_attr", "load_in_4bit"), "load_in_8bit": ("arg_attr", "load_in_8bit")},
        (
            ("trl_quant_config_no_storage", {"bnb_4bit_quant_storage": ("absent",)}),
            ("trl_quant_config_storage_torch_dtype", {"bnb_4bit_quant_storage": ("arg_attr", "torch_dtype")}),
            ("trl_quant_config_storage_dtype", {"bnb_4bit_quant_storage": ("arg_attr", "dtype")}),
            ("trl_quant_config_storage_field", {"bnb_4bit_quant_storage": ("arg_attr", "bnb_4bit_quant_storage")}),
        ),
    ),
}
