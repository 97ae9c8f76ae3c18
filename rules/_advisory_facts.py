"""The facts an advisory's trigger is written over (fsdplint.advisories.predicate.FACTS), read from a script
and its launch settings, each with where it is written so that a finding points at that line."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import libcst as cst

from fsdplint.analysis import UNKNOWN


@dataclass(frozen=True)
class Fact:
    value: Any
    site: Any  # a launch Setting (script node or YAML line) or a cst node
    # Only likely: the setting is written, but whether it acts as the trigger needs what fsdplint cannot see
    # here (a finding that rests on it is a warning).
    likely: str = ""


def _snake(name: str) -> str:
    """bitsandbytes' class names as TrainingArguments spells the optimizer: PagedAdamW8bit -> paged_adamw_8bit."""
    s = re.sub(r"(?<!^)(?=[A-Z])", "_", name.replace("AdamW", "Adamw"))
    return re.sub(r"(?<=[a-z])(\d+bit)$", r"_\1", s).lower()


def optimizer_library(name: Any) -> Any:
    """The library whose optimizer a TrainingArguments/axolotl name runs: torchao's low-bit AdamW
    (adamw_torch_4bit, adamw_torch_8bit, adamw_torch_fp8), bitsandbytes' (adamw_bnb_8bit, adamw_8bit,
    paged_*, lion_8bit, rmsprop_bnb, ademamix), else None (torch's own, or a name not known here)."""
    if not isinstance(name, str):
        return None
    n = name.strip().lower()
    if re.fullmatch(r"adamw_torch_(4bit|8bit|fp8)|.*torchao.*", n):
        return "torchao"
    if re.search(r"bnb|paged|(^|_)(8bit|32bit)$|^(lion|ademamix)", n):
        return "bitsandbytes"
    return None


_TRUE_SETTINGS = {
    # fact -> launch setting keys (after accelerate's fsdp_ prefix is dropped)
    "offload": ("offload_params",),
    "activation_checkpointing": ("activation_checkpointing",),
    "cpu_ram_efficient_loading": ("cpu_ram_efficient_loading",),
    "use_orig_params": ("use_orig_params",),
}
_PLAIN_SETTINGS = ("optim", "gradient_accumulation_steps", "gradient_checkpointing", "save_strategy",
                   "save_only_model", "state_dict_type", "torch_compile", "auto_wrap_policy",
                   "transformer_layer_cls_to_wrap", "use_vllm", "precompute_ref_log_probs")


def _truthy(v: Any) -> Any:
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    return v


_CONDITIONAL = "it is set under an `if` whose value fsdplint cannot read here"


def _conditional_nodes(a) -> set:
    """Ids of the values the script writes only under an `if` it cannot decide (`if cfg.offload:
    os.environ["FSDP_OFFLOAD_PARAMS"] = "true"`, a TrainingArguments call in such a branch)."""
    out = set()
    items = [(ds, (ds.value,)) for sc in a.c.scopes for ds in sc.dict_sets]
    items += [(c, tuple(arg.value for arg in c.node.args)) for c in a.calls("TrainingArguments", "FullyShardedDataParallelPlugin")]
    for item, nodes in items:
        for g in getattr(item, "guards", ()):
            test = getattr(g.node, "test", None)
            if test is not None and UNKNOWN in a.truth(test, item.scope):
                out.update(id(n) for n in nodes)
                break
    return out


def script_facts(a) -> dict[str, Fact]:
    facts: dict[str, Fact] = {}
    # A call counts only where FSDP is in its program: FSDP in one test of a file says nothing of another.
    under_fsdp = a.fsdp_at
    launch = getattr(a, "launch", None)
    if launch is not None:
        conditional = _conditional_nodes(a)

        def fact_of(s):
            return Fact(_truthy(s.value), s, _CONDITIONAL if id(s.node) in conditional else "")

        for key in _PLAIN_SETTINGS:
            s = launch.get(key)
            if s is not None and s.value is not None and s.value is not UNKNOWN:
                facts[key] = fact_of(s)
        for fact, keys in _TRUE_SETTINGS.items():
            for key in keys:
                s = launch.get(key)
                if s is not None and s.value is not None and s.value is not UNKNOWN:
                    facts[fact] = fact_of(s)
        sharding = launch.get("sharding")
        if sharding is not None and isinstance(sharding.value, str) and "offload" in sharding.value.split():
            facts.setdefault("offload", Fact(True, sharding))
        if launch.fsdp_version is not None:
            site = launch.get("version") or sharding or launch.get("sharding_strategy") or launch.get("distributed_type")
            facts["fsdp_version"] = Fact(launch.fsdp_version, site)
            facts["fsdp_wrapper"] = Fact("accelerate", site)
    if "fsdp_version" not in facts:
        for api, version in (("fully_shard", 2), ("FSDP1", 1)):
            calls = a.calls(api)
            if calls:
                facts["fsdp_version"] = Fact(version, calls[0].node)
                # The script wraps the model itself: accelerate's FSDP preparation (and its bugs) is not run.
                facts["fsdp_wrapper"] = Fact("torch", calls[0].node)
                break
    for call in a.calls("fully_shard"):
        policy = call.kw("offload_policy")
        if policy is not None and "CPUOffloadPolicy" in a.code(policy):
            facts.setdefault("offload", Fact(True, policy))
    for call in a.calls("FSDP1"):
        # FullyShardedDataParallel's own default is use_orig_params=False (accelerate's plugin defaults to True).
        orig = call.kw("use_orig_params")
        value = a.value(orig, call.scope) if orig is not None else False
        if isinstance(value, bool):
            facts.setdefault("use_orig_params", Fact(value, orig if orig is not None else call.node))
        off = call.kw("cpu_offload")
        if off is not None and re.search(r"offload_params\s*=\s*True", a.code(off)):
            facts.setdefault("offload", Fact(True, off))
    for call in a.calls("BitsAndBytesConfig", "load_model"):
        if not under_fsdp(call):
            continue
        for bits in (4, 8):
            arg = a.keyword(call, f"load_in_{bits}bit")
            if arg is not None and arg is not UNKNOWN and a.value(arg, call.scope) is True:
                facts.setdefault("quant_bits", Fact(bits, call.kwarg(f"load_in_{bits}bit") or call.node))
        storage = call.kw("bnb_4bit_quant_storage")
        if storage is not None:
            value = a.value(storage, call.scope)
            text = value if isinstance(value, str) else a.code(storage)
            facts.setdefault("quant_storage", Fact(text.rsplit(".", 1)[-1], storage))
    for call in a.all_calls:
        if not under_fsdp(call):
            continue
        q = call.qualname or ""
        m = re.fullmatch(r"peft(?:\.[\w.]+)?\.(\w+)Config", q)
        if m and m.group(1) not in ("Peft", "PromptLearning"):
            facts.setdefault("peft_method", Fact(m.group(1).lower(), call.node))
        if q.startswith("bitsandbytes.optim."):
            facts.setdefault("optim", Fact(_snake(q.rsplit(".", 1)[-1]), call.node))
    trainers = [t for t in a.calls("Trainer") if under_fsdp(t)]
    if trainers:
        t = trainers[0]
        facts["trainer"] = Fact((t.qualname or "Trainer").rsplit(".", 1)[-1], t.node)
        if t.kw("peft_config") is not None:
            facts["peft"] = Fact(True, t.kwarg("peft_config"))
            given = _peft_config_given(a, t)
            if given is not None:
                facts["peft_config_to_trainer"] = given
        # DPOTrainer(model, ref_model, ...): the reference model is the second positional argument of trl's
        # preference trainers.
        ref = t.arg(1, "ref_model") if facts["trainer"].value in _REF_MODEL_TRAINERS else t.kw("ref_model")
        if ref is not None and a.value(ref, t.scope) is not None:
            facts["ref_model_to_trainer"] = Fact(True, ref)
    for call in a.calls("Accelerator"):
        if not under_fsdp(call):
            continue
        ga = call.kw("gradient_accumulation_steps")
        value = a.value(ga, call.scope) if ga is not None else None
        if isinstance(value, int) and not isinstance(value, bool):
            facts.setdefault("gradient_accumulation_steps", Fact(value, ga))
    wrapped = _wrapped_names(a)
    for call in a.all_calls:
        if call.method in _ADAPTER_TOGGLES and under_fsdp(call):
            # Certain when the adapters switched are those of a model this file wrapped (`model = FSDP(model)`,
            # `fully_shard(model)`, then `model.module.disable_adapter()`).
            root = _root(a.code(call.receiver)) if call.receiver is not None else None
            likely = "" if (id(call.scope), root) in wrapped else "the adapters switched here may not be those of an FSDP-wrapped model"
            fact = Fact(True, call.node, likely)
            if "toggles_adapters" not in facts or (facts["toggles_adapters"].likely and not likely):
                facts["toggles_adapters"] = fact
    if launch is not None and "mixed_precision" not in facts:
        mp = launch.get("mixed_precision")
        if mp is not None and isinstance(mp.value, str):
            facts["mixed_precision"] = fact_of(mp)
        for key in ("bf16", "fp16"):
            s = launch.get(key)
            if "mixed_precision" not in facts and s is not None and _truthy(s.value) is True:
                facts["mixed_precision"] = Fact(key, s, _CONDITIONAL if id(s.node) in conditional else "")
    for call in a.calls("Accelerator"):
        mp = call.kw("mixed_precision")
        value = a.value(mp, call.scope) if mp is not None else None
        if under_fsdp(call) and isinstance(value, str):
            facts.setdefault("mixed_precision", Fact(value, mp))
    for call in a.all_calls:
        if (call.qualname or call.func or "").rsplit(".", 1)[-1] in ("set_model_state_dict", "set_state_dict") \
                and under_fsdp(call) and re.search(r"broadcast_from_rank0\s*=\s*True", a.code(call.node)):
            facts.setdefault("broadcast_from_rank0", Fact(True, call.node))
    for call in a.calls("LoraConfig"):
        if not under_fsdp(call):
            continue
        targets = call.kw("target_modules")
        names = a.value(targets, call.scope) if targets is not None else None
        if isinstance(names, (list, tuple, set)) and any(isinstance(n, str) and _EMBEDDING.search(n) for n in names):
            facts.setdefault("lora_targets_embedding", Fact(True, call.kwarg("target_modules")))
        tokens = call.kw("trainable_token_indices")
        if tokens is not None and a.value(tokens, call.scope) is not None:
            facts.setdefault("lora_trainable_tokens", Fact(True, call.kwarg("trainable_token_indices")))
        dora = call.kw("use_dora")
        if dora is not None and a.value(dora, call.scope) is True:
            facts.setdefault("lora_use_dora", Fact(True, call.kwarg("use_dora")))
    for call in a.all_calls:
        if not under_fsdp(call):
            continue
        if call.method in ("save_pretrained", "save_model") or (call.qualname or "").endswith("get_peft_model_state_dict"):
            facts.setdefault("saves_model", Fact(True, call.node))
            break
    if "saves_model" not in facts and "trainer" in facts:
        strategy = facts.get("save_strategy")
        if strategy is None or str(strategy.value).lower() != "no":
            facts["saves_model"] = Fact(True, facts["trainer"].site)
    for call in a.all_calls:
        if not under_fsdp(call):
            continue
        resume = call.kw("resume_from_checkpoint") if call.method == "train" else None
        if call.method == "load_state" or (resume is not None and a.value(resume, call.scope) not in (None, False)):
            facts.setdefault("loads_state", Fact(True, call.node))
            break
    saves = _optimizer_save(a, facts)
    if saves is not None:
        facts["saves_optimizer_state"] = Fact(True, saves)
    if "peft" not in facts:
        peft = a.calls("get_peft_model")
        if peft:
            facts["peft"] = Fact(True, peft[0].node)
    return facts


# The embedding layers' names in the architectures fsdplint knows (LoRA on them makes lora_embedding_A/B).
_EMBEDDING = re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|tok_embeddings|embed_in|shared)$")

_REF_MODEL_TRAINERS = ("DPOTrainer", "KTOTrainer")


def _peft_config_given(a, trainer):
    """The trainer's own adapter preparation (trl's k-bit preparation) runs only when peft_config is a config:
    certain for a PEFT config class written there or bound to the name passed, only likely for a value fsdplint
    cannot read (a helper such as trl's get_peft_config returns None unless adapters are asked for)."""
    node = trainer.kw("peft_config")
    if a.value(node, trainer.scope) is None:
        return None  # `peft_config=None`, or a name bound to None
    expr = a.binding(node.value, trainer.scope) if isinstance(node, cst.Name) else node
    if isinstance(expr, cst.Call) and re.search(r"Config$", a.code(expr.func)) and "get_" not in a.code(expr.func):
        return Fact(True, trainer.kwarg("peft_config"))
    return Fact(True, trainer.kwarg("peft_config"), "the peft_config passed may be None at run time")


_ADAPTER_TOGGLES = ("disable_adapter", "set_adapter", "enable_adapter_layers", "disable_adapter_layers")
_OPTIM_SAVES = ("optim_state_dict", "full_optim_state_dict", "sharded_optim_state_dict", "get_optimizer_state_dict",
                "get_state_dict")


def _optimizer_save(a, facts):
    """Where the job saves optimizer state: a Trainer that writes checkpoints (save_strategy is not "no" and
    save_only_model is not set), `accelerator.save_state`, or FSDP's optimizer state dict APIs."""
    for call in a.all_calls:
        if not a.fsdp_at(call):
            continue
        last = (call.qualname or call.func or "").rsplit(".", 1)[-1]
        if call.method == "save_state" or last in _OPTIM_SAVES:
            return call.node
    if "trainer" in facts:
        strategy = facts.get("save_strategy")
        only = facts.get("save_only_model")
        if (strategy is None or str(strategy.value).lower() != "no") and (only is None or only.value is not True):
            return facts["trainer"].site
    return None


def _root(text: str) -> str:
    return re.split(r"[.\[(]", text.strip(), 1)[0]


def _wrapped_names(a) -> set:
    """(scope, name) of the models wrapped with FSDP: the target of `x = FSDP(...)`, the argument of
    `fully_shard(x)` (in place); per scope, as one name in two functions is two variables."""
    out = set()
    for call in a.calls("FSDP1"):
        out.update((id(call.scope), _root(a.code(t))) for t in call.targets)
    for call in a.calls("fully_shard"):
        arg = call.arg(0, "module")
        if arg is not None:
            out.add((id(call.scope), _root(a.code(arg))))
    return out


# --- a training-tool job (axolotl / LLaMA-Factory YAML) -------------------------------------------------
# The tool's key for a fact when it differs from the fact's name (both tools pass these to TrainingArguments).
_JOB_KEYS = {
    "axolotl": {"optim": ("optimizer",), "gradient_accumulation_steps": ("gradient_accumulation_steps",),
                "gradient_checkpointing": ("gradient_checkpointing",), "save_strategy": ("save_strategy",),
                "save_only_model": ("save_only_model",), "torch_compile": ("torch_compile",),
                "use_vllm": ("use_vllm", "trl.use_vllm")},
    "llamafactory": {"optim": ("optim",), "gradient_accumulation_steps": ("gradient_accumulation_steps",),
                     "gradient_checkpointing": ("gradient_checkpointing",), "save_strategy": ("save_strategy",),
                     "save_only_model": ("save_only_model",), "torch_compile": ("torch_compile",)},
    # Oumi's nested TrainingParams (to_hf(): optimizer -> optim, compile -> torch_compile).
    "oumi": {"optim": ("training.optimizer",), "gradient_accumulation_steps": ("training.gradient_accumulation_steps",),
             "torch_compile": ("training.compile",)},
}
# The trainer class each tool runs for a preference/RL stage (axolotl `rl:`, LLaMA-Factory `stage:`): both
# subclass trl's trainer of that name (axolotl core/trainers/dpo, LLaMA-Factory train/dpo/trainer.py).
_RL_TRAINERS = {"dpo": "DPOTrainer", "ipo": "DPOTrainer", "kto": "KTOTrainer", "orpo": "ORPOTrainer",
                "grpo": "GRPOTrainer", "simpo": "CPOTrainer"}
# The transformers Trainer class a tool's supervised stages subclass, by stage (None: no stage written, the
# tool's default): LLaMA-Factory train/pt CustomTrainer(Trainer), train/sft CustomSeq2SeqTrainer(Seq2SeqTrainer)
# (stage sft is its default, hparams/finetuning_args.py), train/rm PairwiseTrainer(Trainer). (axolotl's
# AxolotlTrainer subclasses Trainer too, but axolotl patches the Trainer's internals per release: not claimed.)
_SUPERVISED_TRAINERS = {"llamafactory": {None: "Seq2SeqTrainer", "sft": "Seq2SeqTrainer", "pt": "Trainer",
                                         "rm": "Trainer"}}
_NO_DEFAULT_SAVE = "whether the tool writes checkpoints is left to its defaults (no save_strategy/save_steps written)"


def _oumi_facts(job, facts: dict) -> None:
    """Oumi's Trainer and checkpoint settings: TrainingParams.to_hf() saves every `save_steps` (default 100)
    steps, else each epoch with `save_epoch`, else never; the trainer class comes from `trainer_type`."""
    from fsdplint.launch.tools.oumi import trainer_class

    steps, epoch = job.get("training.save_steps"), job.get("training.save_epoch")
    n = steps.value if steps is not None else 100
    saves = (isinstance(n, int) and not isinstance(n, bool) and n > 0) or (epoch is not None and _truthy(epoch.value) is True)
    site = steps or epoch or job.get("training")
    if site is not None:
        facts["save_strategy"] = Fact("steps" if saves else "no", site)
    name = trainer_class(job)
    if name is not None:
        facts["trainer"] = Fact(name, job.get("training.trainer_type") or job.get("training") or job.model)


def job_facts(job) -> dict[str, Fact]:
    """The job's own settings as facts, each at its YAML line (its FSDP settings come as launch facts)."""
    facts: dict[str, Fact] = {}
    for fact, keys in _JOB_KEYS.get(job.tool, {}).items():
        for key in keys:
            s = job.get(key)
            if s is not None and s.value is not None:
                facts[fact] = Fact(_truthy(s.value), s)
                break
    if job.quant is not None:
        facts["quant_bits"] = Fact(job.quant.bits, job.quant.setting)
        if job.quant.storage:
            facts["quant_storage"] = Fact(job.quant.storage, job.quant.storage_setting or job.quant.setting)
    if job.adapter is not None:
        method = str(job.adapter.value or "").strip().lower()
        if method in ("lora", "qlora"):
            facts["peft"] = Fact(True, job.adapter)
            facts["peft_method"] = Fact("lora", job.adapter)
    if job.tool == "llamafactory":
        # LLaMA-Factory checkpoints gradients unless told not to, reentrant by default (hparams/model_args.py
        # disable_gradient_checkpointing=False, use_reentrant_gc=True).
        off = job.get("disable_gradient_checkpointing")
        if off is None or _truthy(off.value) is not True:
            site = off or job.model
            facts.setdefault("gradient_checkpointing", Fact(True, site))
            reentrant = job.get("use_reentrant_gc")
            if reentrant is None or _truthy(reentrant.value) is not False:
                facts["reentrant_checkpointing"] = Fact(True, reentrant or site)
    elif job.tool == "axolotl":
        kwargs = job.get("gradient_checkpointing_kwargs")
        gc = facts.get("gradient_checkpointing")
        if gc is not None and gc.value not in (False, None) and kwargs is not None and isinstance(kwargs.value, dict):
            if _truthy(kwargs.value.get("use_reentrant")) is True:
                facts["reentrant_checkpointing"] = Fact(True, kwargs)
        final = job.launch.get("final_state_dict_type") if job.launch is not None else None
        if final is not None and final.value is not None:
            facts["final_state_dict_type"] = Fact(final.value, final)
    for key in ("bf16", "fp16"):
        s = job.get(key)
        v = _truthy(s.value) if s is not None else None
        if s is not None and (v is True or (key == "bf16" and isinstance(v, str) and v.strip().lower() == "auto")):
            facts.setdefault("mixed_precision", Fact(key, s))
    if job.lora_targets and any(_EMBEDDING.search(t) for t in job.lora_targets):
        facts["lora_targets_embedding"] = Fact(True, job.targets_setting)
    if job.tool == "oumi":
        _oumi_facts(job, facts)
    stage = job.get("rl") if job.tool == "axolotl" else job.get("stage")
    if stage is not None and str(stage.value).strip().lower() in _RL_TRAINERS:
        facts["trainer"] = Fact(_RL_TRAINERS[str(stage.value).strip().lower()], stage)
    elif job.tool in _SUPERVISED_TRAINERS:
        # Without a preference/RL stage the tool trains with its subclass of a transformers Trainer, whose
        # FSDP handling (e.g. the peft auto-wrap policy for a LoRA model) is the Trainer's.
        kind = str(stage.value).strip().lower() if stage is not None else None
        name = _SUPERVISED_TRAINERS[job.tool].get(kind)
        if name is not None:
            facts["trainer"] = Fact(name, stage or job.model)
    resume = job.get("resume_from_checkpoint")
    if resume is not None and resume.value not in (None, False, ""):
        facts["loads_state"] = Fact(True, resume)
    # Both tools train with a transformers Trainer, which writes checkpoints unless told not to.
    strategy = facts.get("save_strategy")
    if strategy is None or str(strategy.value).lower() != "no":
        written = strategy.site if strategy is not None else job.get("save_steps")
        site = written or job.model
        if site is not None:
            likely = "" if written is not None else _NO_DEFAULT_SAVE
            facts["saves_model"] = Fact(True, site, likely)
            only = facts.get("save_only_model")
            if only is None or only.value is not True:
                facts["saves_optimizer_state"] = Fact(True, site, likely)
    return facts
