from typing import Optional

from fsdplint import behaviour
from fsdplint.facts import READ, Fact
from fsdplint.findings import Applicability, Severity
from fsdplint.rule import IN_FSDP_JOB, Invalid, Rule, Valid
from fsdplint.rules._checkpointing import NON_REENTRANT_DEFAULT_SINCE, hf_checkpointing


class ReentrantCheckpointingFrozenBase(Rule):
    code = "FSDP105"
    name = "reentrant-checkpointing-frozen-base"
    severity = Severity.ERROR
    summary = (
        "Gradient checkpointing with a frozen base and reentrant checkpointing, without "
        "enable_input_require_grads."
    )
    sides = "S"
    fix = Applicability.SAFE
    versions = {"transformers": "<5.0"}
    # A frozen base under reentrant checkpointing gets no gradient with or without FSDP (transformers#26221
    # and trl#3089 have no FSDP at all): reported whether or not FSDP is in the job.
    needs_fsdp = False
    doc = """
    ## What it does
    Finds Hugging Face gradient checkpointing (`model.gradient_checkpointing_enable()` or
    `TrainingArguments(gradient_checkpointing=True)`) in a LoRA script when the checkpointing is
    reentrant (`use_reentrant=True`, or the transformers default before v5) and nothing makes the
    layer inputs require grad (`model.enable_input_require_grads()`).

    ## Why is this bad?
    Reentrant `torch.utils.checkpoint` only builds a graph through a checkpointed block when one of its
    *inputs* requires grad. With a frozen base model the hidden states entering each decoder layer do
    not, so backward fails with `RuntimeError: element 0 of tensors does not require grad and does not
    have a grad_fn`, or the LoRA weights inside the checkpointed layers silently get no gradient.

    peft calls `enable_input_require_grads()` itself in `get_peft_model` when checkpointing was enabled
    *before* it on an unquantized model, in `prepare_model_for_kbit_training` and in
    `PeftModel.prepare_model_for_gradient_checkpointing`; transformers does it
    when the adapter was added with `model.add_adapter`; trl's trainers do it for PEFT models (SFTTrainer
    and DPOTrainer in every release covered, GRPOTrainer from trl 0.16.0, read at 0.15.2 and 0.16.0: see fsdplint/behaviour.py). Those
    cases are not reported. A frozen base gets no gradient with or without FSDP, so this rule does not
    need FSDP in the job.

    ## Example
    ```python
    model = get_peft_model(model, lora_config)
    model.gradient_checkpointing_enable()
    ```

    ## Use instead
    ```python
    model = get_peft_model(model, lora_config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ```

    ## Fix safety
    Safe: non-reentrant checkpointing recomputes the same forward and gives the same gradients; it only
    lifts the requirement that an input needs grad (and is the variant PyTorch recommends).

    ## Versions
    transformers 4.35-4.57 default to `use_reentrant=True` (transformers#28538) and enable input grads
    only for adapters added with `add_adapter`. transformers 5.0 switched to `use_reentrant=False`
    (transformers#43203) and enables input grads for every text model when checkpointing is turned on,
    so only scripts that target transformers < 5.0 are checked (checked in the 4.57.1 and 5.0.0 sources).

    ## References
    - transformers#23170, #21381, #26221, #28538, #43203
    - peft#1142; trl#3089
    """
    references = ("transformers#23170", "transformers#21381", "transformers#26221", "peft#1142", "trl#3089")

    facts = (
        Fact("trl trainers that enable input grads for a PEFT model themselves (no finding)",
             "SFT/DPO/KTO: every release read; GRPO >= 0.16.0; Reward >= 0.26.0; RLOO >= 0.27.0", READ,
             "behaviour entries trl_peft_input_grads, trl_kto_/grpo_/reward_/rloo_peft_input_grads",
             "python bench/facts/release_bisect.py trl trl/trainer/grpo_trainer.py --regex enable_input_require_grads",
             read_at=("0.15.2", "0.16.0")),
    )

    VALID = [
        # Non-reentrant checkpointing needs no grad-requiring input.
        """
        from peft import get_peft_model
        model = get_peft_model(model, lora_config)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        """,
        # The input-grad hook.
        """
        from peft import get_peft_model as add_lora
        model = add_lora(model, lora_config)
        model.enable_input_require_grads()
        model.gradient_checkpointing_enable()
        """,
        # PeftModel.prepare_model_for_gradient_checkpointing enables input grads (or the embedding hook).
        """
        from peft import get_peft_model
        lora_model = get_peft_model(base_model, lora_config)
        lora_model.prepare_model_for_gradient_checkpointing(lora_model)
        lora_model.gradient_checkpointing_enable()
        """,
        # Checkpointing enabled before get_peft_model: peft enables input grads itself.
        """
        from peft import get_peft_model
        model.gradient_checkpointing_enable()
        model = get_peft_model(model, lora_config)
        """,
        # prepare_model_for_kbit_training enables input grads for reentrant checkpointing.
        """
        from peft import get_peft_model, prepare_model_for_kbit_training
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
        model = get_peft_model(model, lora_config)
        """,
        # trl's trainers, given peft_config, make the inputs require grad themselves (trl sft_trainer.py,
        # every release covered), however checkpointing was turned on.
        """
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM, TrainingArguments
        from trl import SFTTrainer
        model = AutoModelForCausalLM.from_pretrained("org/model")
        model.gradient_checkpointing_enable()
        args = TrainingArguments(output_dir="out", gradient_checkpointing=True, fsdp="full_shard")
        trainer = SFTTrainer(model=model, args=args, peft_config=LoraConfig(r=16), train_dataset=ds)
        """,
        # trl's SFTTrainer prepares the PEFT model itself.
        """
        from trl import SFTConfig, SFTTrainer
        from peft import LoraConfig
        args = SFTConfig(output_dir="out", gradient_checkpointing=True)
        trainer = SFTTrainer(model=model, args=args, peft_config=LoraConfig(r=16))
        """,
        # From trl 0.16.0 GRPOTrainer enables input grads for the PEFT model it builds (0.15.2 does not).
        Valid(
            """
            from peft import LoraConfig
            from trl import GRPOConfig, GRPOTrainer
            cfg = GRPOConfig(output_dir="out", gradient_checkpointing=True,
                             gradient_checkpointing_kwargs={"use_reentrant": True})
            trainer = GRPOTrainer(model="org/m", reward_funcs=f, args=cfg, peft_config=LoraConfig(r=8))
            """,
            target={"trl": "0.17.0", "transformers": "4.51"},
        ),
        # trl 0.16.0 already does (`_enable_gradient_checkpointing`: model.enable_input_require_grads()).
        Valid(
            """
            from peft import LoraConfig
            from trl import GRPOConfig, GRPOTrainer
            cfg = GRPOConfig(output_dir="out", gradient_checkpointing=True,
                             gradient_checkpointing_kwargs={"use_reentrant": True})
            trainer = GRPOTrainer(model="org/m", reward_funcs=f, args=cfg, peft_config=LoraConfig(r=8))
            """,
            target={"trl": "0.16.0", "transformers": "4.51"},
        ),
        # No LoRA: the base is trainable, so its inputs to each layer require grad.
        """
        from transformers import TrainingArguments
        args = TrainingArguments(output_dir="out", gradient_checkpointing=True)
        """,
        # transformers 5 defaults to non-reentrant checkpointing.
        Valid(
            """
            from peft import get_peft_model
            model = get_peft_model(model, lora_config)
            model.gradient_checkpointing_enable()
            """,
            target={"transformers": "5.2"},
        ),
        # The checkpointed model never gets LoRA: fully trained here, LoRA only in the other branch
        # (peft's dreambooth examples).
        """
        from peft import LoraConfig, get_peft_model
        unet = get_peft_model(unet, LoraConfig(target_modules=["to_q", "to_v"]))
        if not args.train_text_encoder:
            text_encoder.requires_grad_(False)
        elif args.train_text_encoder and args.use_lora:
            text_encoder = get_peft_model(text_encoder, LoraConfig(target_modules=["q_proj", "v_proj"]))
        if args.gradient_checkpointing:
            if args.train_text_encoder and not args.use_lora:
                text_encoder.gradient_checkpointing_enable()
        """,
    ]
    INVALID = [
        Invalid(
            """
            from peft import get_peft_model
            model = get_peft_model(model, lora_config)
            model.gradient_checkpointing_enable()
            """,
            target={"transformers": "4.46"},
            options=IN_FSDP_JOB,
            line=3,
            expected_fix="""
            from peft import get_peft_model
            model = get_peft_model(model, lora_config)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            """,
        ),
        Invalid(
            """
            import peft
            model = peft.get_peft_model(model, cfg)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
            """,
            options=IN_FSDP_JOB,
            line=3,
            target={"transformers": "4.50"},
            expected_fix="""
            import peft
            model = peft.get_peft_model(model, cfg)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            """,
        ),
        Invalid(
            """
            from transformers import Trainer, TrainingArguments as TA
            from peft import LoraConfig, get_peft_model as add_lora
            model = add_lora(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
            args = TA(
                output_dir="out",
                gradient_checkpointing=True,
                bf16=True,
            )
            trainer = Trainer(model=model, args=args, train_dataset=ds)
            """,
            target={"transformers": "4.46"},
            options=IN_FSDP_JOB,
            line=6,
            expected_fix="""
            from transformers import Trainer, TrainingArguments as TA
            from peft import LoraConfig, get_peft_model as add_lora
            model = add_lora(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
            args = TA(
                output_dir="out",
                gradient_checkpointing=True,
                bf16=True,
                gradient_checkpointing_kwargs={"use_reentrant": False},
            )
            trainer = Trainer(model=model, args=args, train_dataset=ds)
            """,
        ),
        Invalid(
            """
            from peft import get_peft_model
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            def build(model, cfg):
                model = get_peft_model(model, cfg)
                model.gradient_checkpointing_enable()
                return FSDP(model, use_orig_params=True)
            """,
            target={"transformers": "4.46"},
            line=6,
        ),
        # trl 0.15's GRPOTrainer builds the PEFT model without enabling input grads (trl#3089); no FSDP needed.
        Invalid(
            """
            from peft import LoraConfig
            from trl import GRPOConfig, GRPOTrainer
            cfg = GRPOConfig(output_dir="out", gradient_checkpointing=True,
                             gradient_checkpointing_kwargs={"use_reentrant": True})
            trainer = GRPOTrainer(model="org/m", reward_funcs=f, args=cfg, peft_config=LoraConfig(r=8))
            """,
            target={"trl": "0.15.2", "transformers": "4.48"},
            line=3,
            expected_fix="""
            from peft import LoraConfig
            from trl import GRPOConfig, GRPOTrainer
            cfg = GRPOConfig(output_dir="out", gradient_checkpointing=True,
                             gradient_checkpointing_kwargs={"use_reentrant": False})
            trainer = GRPOTrainer(model="org/m", reward_funcs=f, args=cfg, peft_config=LoraConfig(r=8))
            """,
        ),
        # No transformers version declared or installed: the reentrant default is a guess, so a warning.
        Invalid(
            """
            from peft import get_peft_model
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = get_peft_model(model, lora_config)
            model.gradient_checkpointing_enable()
            model = FSDP(model, use_orig_params=True)
            """,
            line=4,
            severity="warning",
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        if not a.uses_peft or a.calls("prepare_model_for_kbit_training"):
            return
        if any(e.data.get("implicit") for e in a.events("kbit_prep")):
            return  # a library call runs prepare_model_for_kbit_training (trl's value head, DPOTrainer): input grads on
        if ctx.version("transformers") >= NON_REENTRANT_DEFAULT_SINCE:
            return  # v5 checkpoints non-reentrantly by default and enables input grads for text models itself
        if a.method_calls("enable_input_require_grads", "prepare_model_for_gradient_checkpointing") or _input_grad_hook(a):
            return
        lora_calls = a.calls("get_peft_model", "inject_adapter_in_model", "PeftModel_from_pretrained", "LoraConfig")
        if not lora_calls and a.method_calls("add_adapter"):
            return  # transformers' PEFT integration enables input grads with checkpointing
        if _trl_prepares(ctx, a):
            return  # trl's trainer, given peft_config, makes the inputs require grad itself
        quantized = _quantized(a)
        trl_without, trl_key = _trl_without_input_grads(ctx, a) or (None, None)
        for site in hf_checkpointing(a):
            if site.trl and trl_without is None:
                continue  # a trl config: its trainers prepare PEFT models themselves
            if not site.via_args and not quantized and _lora_after(a, site):
                continue  # get_peft_model on a checkpointing model calls enable_input_require_grads
            if not site.via_args and _never_lora(a, site):
                continue  # another model (or the branch without LoRA): its base trains, inputs require grad
            if site.replaced == "inputs":
                continue  # the project's own method, bound to the model, makes the inputs require grad
            reentrant, why = site.reentrant(ctx)
            if not reentrant:
                continue
            if site.trl:
                why += f"; {trl_without} does not enable input grads for the PEFT model it builds"
            # Reentrant by the transformers default: only as sure as the transformers version is known.
            severity = None if site.use_reentrant is True else ctx.version_severity(ctx.version("transformers"))
            if severity is not None:
                why += "; " + ctx.version("transformers").declare_hint(NON_REENTRANT_DEFAULT_SINCE)
            if site.replaced == "unknown":
                # The call runs a function the project bound to the model, whose code is not read here.
                severity = Severity.WARNING
                why += f"; {site.call.method} is replaced on the model by a function not read here, which decides"
            ctx.report(
                site.node,
                f"Gradient checkpointing is reentrant here ({why}) and the LoRA base model is frozen, so the "
                "inputs of each checkpointed layer do not require grad: backward raises 'element 0 of tensors does "
                "not require grad' or the adapters get no gradient. Pass "
                'gradient_checkpointing_kwargs={"use_reentrant": False} (or call model.enable_input_require_grads()).',
                fix=site.fix(),
                severity=severity,
                rests_on=(trl_key,) if site.trl else (),
            )


# trl trainers and the behaviour entry that says they enable input grads for a PEFT model.
_TRL_TRAINERS = {"SFTTrainer": "trl_peft_input_grads", "DPOTrainer": "trl_peft_input_grads",
                 "GRPOTrainer": "trl_grpo_peft_input_grads", "KTOTrainer": "trl_kto_peft_input_grads",
                 "RewardTrainer": "trl_reward_peft_input_grads", "RLOOTrainer": "trl_rloo_peft_input_grads"}


def _trl_prepares(ctx, a) -> bool:
    """A trl trainer given `peft_config=` on a trl release that enables input grads (or an unknown one)."""
    for c in a.c.calls:
        q = c.qualname or ""
        if not q.startswith("trl.") or c.kwarg("peft_config") is None:
            continue
        key = _TRL_TRAINERS.get(q.rsplit(".", 1)[-1])
        if key is not None and behaviour.holds(key, ctx.version("trl")) is not False:
            return True
    return False


def _trl_without_input_grads(ctx, a) -> Optional[tuple[str, str]]:
    """The trl trainer given `peft_config=` on a known trl release that does not enable input grads
    (behaviour.py): e.g. ("trl 0.15.2's GRPOTrainer", its behaviour key); None when there is none."""
    for c in a.c.calls:
        q = c.qualname or ""
        if not q.startswith("trl.") or c.kwarg("peft_config") is None:
            continue
        name = q.rsplit(".", 1)[-1]
        key = _TRL_TRAINERS.get(name)
        if key is not None and behaviour.holds(key, ctx.version("trl")) is False:
            return f"trl {ctx.version('trl').version}'s {name}", key
    return None


def _input_grad_hook(a) -> bool:
    """A hand-written `get_input_embeddings().register_forward_hook(make_inputs_require_grad)`."""
    for c in a.method_calls("register_forward_hook"):
        if "require" in a.code(c.node).lower():
            return True
    return False


def _quantized(a) -> bool:
    for c in a.calls("BitsAndBytesConfig", "load_model"):
        for kw in ("load_in_4bit", "load_in_8bit", "quantization_config"):
            if c.kw(kw) is not None:
                return True
    return False


def _never_lora(a, site) -> bool:
    """The checkpointed model is one the script injects no LoRA into on the same path (all entities known)."""
    for t in a.timelines:
        for ev in t.events:
            if ev.call is site.call and ev.kind == "gc_enable":
                loras = t.of("lora")
                if ev.entity is None or not loras or any(lo.entity is None for lo in loras):
                    return False
                return not any(lo.entity == ev.entity and not t.exclusive(lo, ev) for lo in loras)
    return False


def _lora_after(a, site) -> bool:
    """get_peft_model applied to the model after this checkpointing call, in the same timeline."""
    for t in a.timelines:
        for ev in t.events:
            if ev.call is site.call and ev.kind == "gc_enable":
                return bool(t.after(ev, ("lora",)))
    return False
