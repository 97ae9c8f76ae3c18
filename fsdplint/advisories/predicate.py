"""The trigger language of an advisory: a table of fact conditions, all of which must hold.

    [when]
    fsdp_version = 2                       # equal (strings compare case-insensitively)
    optim = { matches = "8bit" }           # a regular expression searched in the value
    trainer = { in = ["SFTTrainer", "DPOTrainer"] }
    gradient_accumulation_steps = { gt = 1 }
    save_only_model = { not = true }       # absent, or any other value
    [when.versions]
    torch = "<2.7"                         # another library of the job, as a PEP 440 specifier

A fact the job does not set is absent: only `not` (and `absent = true`) conditions hold on it.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

# The facts a trigger may name, with what they mean (shown by `fsdplint advisories` and checked on load).
FACTS: dict[str, str] = {
    "fsdp_version": "1 (FullyShardedDataParallel, fsdp= in TrainingArguments, accelerate FSDP1) or 2 (fully_shard, fsdp_version: 2)",
    "fsdp_wrapper": "accelerate when FSDP comes from accelerate (its config, plugin, or the Trainer's fsdp=), torch when the script calls fully_shard / FullyShardedDataParallel itself",
    "offload": "true when parameters are offloaded to CPU (fsdp_offload_params, `offload` in fsdp=, CPUOffload(offload_params=True), CPUOffloadPolicy)",
    "quant_bits": "4 or 8: bitsandbytes load_in_4bit / load_in_8bit",
    "quant_storage": "bnb_4bit_quant_storage, its dtype name (bfloat16, float16, uint8)",
    "peft_method": "the PEFT config class written, lower case without Config (lora, vera, ia3, loha, adalora)",
    "toggles_adapters": "true when the script switches PEFT adapters (disable_adapter(), set_adapter(), enable_/disable_adapter_layers())",
    "use_vllm": "GRPOConfig/RLOOConfig use_vllm (generation in vLLM, weights synced from the trained model)",
    "precompute_ref_log_probs": "DPOConfig/KTOConfig precompute_ref_log_probs (reference log-probs computed once, no reference model kept)",
    "lora_trainable_tokens": "true when LoraConfig(trainable_token_indices=...) trains selected token embeddings",
    "lora_use_dora": "true when LoraConfig(use_dora=True) trains DoRA (QDoRA on a 4-bit base)",
    "saves_model": "true when the job saves the model or adapter (save_pretrained, save_model, get_peft_model_state_dict, Trainer checkpoints)",
    "loads_state": "true when the job resumes: accelerator.load_state(...), trainer.train(resume_from_checkpoint=...)",
    "optim": "the optimizer: TrainingArguments optim= (e.g. paged_adamw_8bit), or a bitsandbytes optimizer class in snake case (PagedAdamW8bit -> paged_adamw_8bit)",
    "trainer": "the trainer class name (Trainer, SFTTrainer, DPOTrainer, GRPOTrainer)",
    "peft": "true when LoRA/PEFT adapters are injected (get_peft_model, peft_config=)",
    "ref_model_to_trainer": "true when a trl preference trainer is given its own reference model (ref_model=, or DPOTrainer's second positional argument)",
    "peft_config_to_trainer": "true when the trainer itself injects the adapters: a trl trainer given peft_config= (not a model get_peft_model already wrapped)",
    "gradient_accumulation_steps": "TrainingArguments or Accelerator gradient_accumulation_steps",
    "gradient_checkpointing": "TrainingArguments gradient_checkpointing",
    "activation_checkpointing": "fsdp_activation_checkpointing",
    "save_strategy": "TrainingArguments save_strategy",
    "save_only_model": "TrainingArguments save_only_model",
    "state_dict_type": "fsdp_state_dict_type (FULL_STATE_DICT, SHARDED_STATE_DICT)",
    "cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading",
    "auto_wrap_policy": "fsdp_auto_wrap_policy (TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP)",
    "transformer_layer_cls_to_wrap": "fsdp_transformer_layer_cls_to_wrap",
    "use_orig_params": "fsdp_use_orig_params",
    "torch_compile": "TrainingArguments torch_compile",
    "reentrant_checkpointing": "true when gradient checkpointing is on and reentrant: LLaMA-Factory's default (use_reentrant_gc: true unless disable_gradient_checkpointing), axolotl gradient_checkpointing_kwargs use_reentrant",
    "final_state_dict_type": "axolotl fsdp_config.final_state_dict_type: the state dict type of the final save (else state_dict_type)",
    "mixed_precision": "bf16, fp16 or no: accelerate config / Accelerator(mixed_precision=...), TrainingArguments bf16=/fp16=, axolotl and LLaMA-Factory bf16:/fp16:",
    "lora_targets_embedding": "true when LoRA targets an embedding layer (embed_tokens, wte, word_embeddings, ... in LoraConfig target_modules, axolotl lora_target_modules, LLaMA-Factory lora_target)",
    "broadcast_from_rank0": "true when the script loads a full state dict broadcast from rank 0 (set_model_state_dict / set_state_dict with StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))",
    "saves_optimizer_state": "true when the job saves optimizer state: a Trainer writing checkpoints (save_strategy not \"no\", save_only_model not set), accelerator.save_state, FSDP.optim_state_dict / get_optimizer_state_dict",
}
OPS = ("matches", "in", "not", "gt", "ge", "lt", "le", "absent")


class PredicateError(ValueError):
    """A trigger that is not written in the language (the loader names the file)."""


def validate(when: Any) -> None:
    if not isinstance(when, dict) or not when:
        raise PredicateError("`when` must be a non-empty table of fact conditions")
    for name, cond in when.items():
        if name == "versions":
            if not isinstance(cond, dict) or not all(isinstance(v, str) for v in cond.values()):
                raise PredicateError("`when.versions` must map library names to PEP 440 specifiers")
            continue
        if name not in FACTS:
            raise PredicateError(f"unknown fact {name!r} in `when` (known: {', '.join(FACTS)})")
        if isinstance(cond, dict):
            bad = [k for k in cond if k not in OPS]
            if bad or not cond:
                raise PredicateError(f"`when.{name}`: unknown operator {bad[0] if bad else '(none)'!r} (known: {', '.join(OPS)})")
            if "matches" in cond:
                try:
                    re.compile(str(cond["matches"]))
                except re.error as e:
                    raise PredicateError(f"`when.{name}.matches`: invalid regular expression: {e}") from None


def _same(value: Any, want: Any) -> bool:
    if isinstance(want, str) and isinstance(value, str):
        return value.lower() == want.lower()
    if isinstance(want, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(want, bool) and value is want
    return value == want


def _number(value: Any):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def condition_holds(cond: Any, present: bool, value: Any) -> bool:
    if not isinstance(cond, dict):
        cond = {"in": cond} if isinstance(cond, list) else {"in": [cond]}
    for op, want in cond.items():
        if op == "absent":
            if bool(want) == present:
                return False
            continue
        if op == "not":
            wants = want if isinstance(want, list) else [want]
            if present and any(_same(value, w) for w in wants):
                return False
            continue
        if not present:
            return False
        if op == "in":
            if not any(_same(value, w) for w in (want if isinstance(want, list) else [want])):
                return False
        elif op == "matches":
            if not isinstance(value, str) or re.search(str(want), value, re.I) is None:
                return False
        else:
            n = _number(value)
            if n is None or isinstance(value, bool):
                return False
            w = float(want)
            if not {"gt": n > w, "ge": n >= w, "lt": n < w, "le": n <= w}[op]:
                return False
    return True


def holds(when: Mapping[str, Any], facts: Mapping[str, Any]) -> bool:
    """Whether every fact condition holds (`when.versions` is the caller's: it needs the job's versions)."""
    for name, cond in when.items():
        if name == "versions":
            continue
        if not condition_holds(cond, name in facts, facts.get(name)):
            return False
    return True
