import re

from fsdplint import behaviour
from fsdplint.analysis import UNKNOWN
from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import RemoveStatement, Replace, unsafe
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._quantization import unknown_choice
from fsdplint.rules._unread import unread_names

# Unread functions that may cast the model back to one dtype after the preparation (`coerce_model_to_dtype`).
MAY_CAST = re.compile(r"dtype|cast|coerce|bf16|bfloat16|fp16|half|precision", re.I)
# Calls that cast (left-out project code that makes none cannot cast the model back).
CASTS = re.compile(r"^(to|half|bfloat16|float|type|to_empty)$|" + MAY_CAST.pattern, re.I)

YAML_FSDP1 = """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 1
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_use_orig_params: false
num_processes: 8
"""


class KbitPrepUnderFsdp(Rule):
    code = "FSDP104"
    name = "kbit-prep-under-fsdp"
    severity = Severity.ERROR
    summary = "`prepare_model_for_kbit_training` under FSDP (fp32 upcast breaks uniform dtype, wastes memory)."
    sides = "S"
    fix = Applicability.UNSAFE
    doc = """
    ## What it does
    Finds peft's `prepare_model_for_kbit_training(model)` in a script that wraps the model with FSDP1
    (`FullyShardedDataParallel`, an accelerate FSDP config, `TrainingArguments(fsdp=...)`). A call inside
    an `if` whose condition mentions FSDP (e.g. `if not use_fsdp:`) is taken as deliberate and skipped.

    ## Why is this bad?
    The function freezes the model, casts every fp16/bf16 parameter that is not a `Params4bit` (norms,
    embeddings, `lm_head`) to fp32, and enables gradient checkpointing. FSDP1 flattens each unit into
    one flat parameter of a single dtype, so the mixed fp32/bf16 unit fails with `ValueError: Must flatten
    tensors with uniform dtype but got torch.bfloat16 and torch.float32`; where it does not fail, the fp32
    copies cost memory on every rank.

    ## Example
    ```python
    model = prepare_model_for_kbit_training(model)
    model = get_peft_model(model, lora_config)
    model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model))
    ```

    ## Use instead
    ```python
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, lora_config)  # freezes the base model itself
    model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model))
    ```

    ## Fix safety
    Unsafe: the fix replaces `model = prepare_model_for_kbit_training(model, ...)` by
    `model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})` (or
    removes it when `use_gradient_checkpointing=False`). The base model is then frozen by `get_peft_model`,
    not here, and no parameter is upcast to fp32 — check that nothing in between relies on either.

    ## Versions
    All peft versions.

    ## References
    - peft src other.py (`prepare_model_for_kbit_training`)
    - trl#4457, #6343; bnb#1569
    """
    references = ("trl#4457", "trl#6343", "bnb#1569")

    VALID = [
        # From trl 0.29 DPOTrainer no longer runs prepare_model_for_kbit_training.
        Valid(
            """
            import torch
            from peft import LoraConfig
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig
            from trl import DPOConfig, DPOTrainer
            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
            policy = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
            cfg = DPOConfig(output_dir="out", fsdp="full_shard auto_wrap")
            trainer = DPOTrainer(policy, args=cfg, train_dataset=ds, peft_config=LoraConfig(r=8))
            """,
            target={"trl": "0.29.0", "transformers": "4.57"},
        ),
        # Single-GPU QLoRA: no FSDP.
        """
        from peft import prepare_model_for_kbit_training, get_peft_model
        model = prepare_model_for_kbit_training(model)
        model = get_peft_model(model, cfg)
        """,
        # Under FSDP without the helper.
        """
        from peft import get_peft_model
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = get_peft_model(model, cfg)
        model = FSDP(model, use_orig_params=False)
        """,
        # Skipped on purpose when FSDP is on (trl/axolotl style).
        """
        from peft import prepare_model_for_kbit_training
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        if not args.use_fsdp:
            model = prepare_model_for_kbit_training(model)
        else:
            model = FSDP(model)
        """,
        Valid(
            """
            from peft import get_peft_model
            model = get_peft_model(model, cfg)
            """,
            options={"accelerate_config": YAML_FSDP1},
        ),
        # A test suite: the QLoRA test does not run under the FSDP test's wrap.
        """
        import unittest
        from peft import get_peft_model, prepare_model_for_kbit_training
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        class GPUTests(unittest.TestCase):
            def test_qlora_training(self):
                model = prepare_model_for_kbit_training(load_4bit())
                get_peft_model(model, cfg)

            def test_fsdp_wrap(self):
                FSDP(get_peft_model(load(), cfg), use_orig_params=False)
        """,
    ]
    INVALID = [
        # trl's DPOTrainer prepares a 4-bit model itself (trl#1375), here under the Trainer's FSDP1.
        Invalid(
            """
            import torch
            from peft import LoraConfig
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig
            from trl import DPOConfig, DPOTrainer
            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
            policy = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
            cfg = DPOConfig(output_dir="out", fsdp="full_shard auto_wrap")
            trainer = DPOTrainer(policy, args=cfg, train_dataset=ds, peft_config=LoraConfig(r=8))
            """,
            target={"trl": "0.15.2", "transformers": "4.46"},
            line=8,
        ),
        Invalid(
            """
            from peft import prepare_model_for_kbit_training, get_peft_model
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = prepare_model_for_kbit_training(model)
            model = get_peft_model(model, cfg)
            model = FSDP(model, use_orig_params=False)
            """,
            line=3,
            expected_fix="""
            from peft import prepare_model_for_kbit_training, get_peft_model
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model = get_peft_model(model, cfg)
            model = FSDP(model, use_orig_params=False)
            """,
        ),
        Invalid(
            """
            import peft
            from accelerate import Accelerator
            accelerator = Accelerator()
            model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
            model = peft.get_peft_model(model, cfg)
            model = accelerator.prepare(model)
            """,
            line=4,
            options={"accelerate_config": YAML_FSDP1},
        ),
        Invalid(
            """
            from peft.utils.other import prepare_model_for_kbit_training as prep
            from transformers import TrainingArguments
            model = prep(model)
            args = TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap")
            """,
            line=3,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        for call in a.calls("prepare_model_for_kbit_training"):
            if not a.fsdp1_at(call):
                continue
            if any("fsdp" in a.code(getattr(g.node, "test", g.node)).lower() for g in call.guards):
                continue
            unseen = _unread_after(a, call)
            if unseen:
                # "The upcast parameters are still fp32 when FSDP wraps" holds only if nothing read casts
                # them back: code that takes the model afterwards and was not read may do it.
                names = unread_names(ctx, unseen)
                ctx.report(call.node, (
                    "prepare_model_for_kbit_training casts the fp16/bf16 non-quantized parameters to fp32, and "
                    f"the model then goes to {names}, whose code was not read and may cast it back to one dtype "
                    "before FSDP wraps it. If nothing does, an FSDP unit mixes dtypes (Must flatten tensors with "
                    "uniform dtype): skip the preparation under FSDP (get_peft_model freezes the base)."), severity=Severity.WARNING)
                continue
            choice = unknown_choice(a, call)
            ctx.report(
                call.node,
                "prepare_model_for_kbit_training casts the fp16/bf16 non-quantized parameters (norms, embeddings, "
                "lm_head) to fp32, so an FSDP unit mixes dtypes (ValueError: Must flatten tensors with uniform "
                "dtype) or wastes memory on every rank" + (
                    f", when `{a.code(choice.node.test)}` (line {ctx.line(choice.node)}), a value fsdplint cannot "
                    "read here (a config or command-line value)" if choice is not None else "") +
                ". Under FSDP skip it: let get_peft_model freeze the base and "
                'call model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}).',
                fix=_fix(ctx, a, call),
                # One option of a choice the job makes at run time: a warning, not an error on a guess.
                severity=Severity.WARNING if choice is not None else None,
            )
        # A library call that runs it on the model (apis.CALL_EFFECTS, e.g. DPOTrainer on a 4-bit model).
        for ev in a.events("kbit_prep"):
            key = ev.data.get("behaviour")
            if not ev.data.get("implicit") or key is None or not a.fsdp1_at(ev.call):
                continue
            b = behaviour.BEHAVIOURS[key]
            tv = ctx.version(b.package)
            holds = behaviour.holds(key, tv)
            if holds is False:
                continue
            by = ctx.code(ev.call.node.func)
            ctx.report(
                ev.node,
                f"{by}(peft_config=...) runs prepare_model_for_kbit_training on this 4-/8-bit model "
                f"({b.package + ' < ' + b.until if b.until else b.package}): it casts the fp16/bf16 non-quantized "
                "parameters (norms, embeddings, lm_head) to fp32, so an FSDP unit mixes dtypes (ValueError: Must "
                "flatten tensors with uniform dtype) or wastes memory on every rank. Under FSDP build the PEFT model "
                "yourself (get_peft_model, no k-bit preparation) and pass it without peft_config."
                + ("" if holds else f"; {tv.describe()} is not known: " + tv.declare_hint(b.until or "")),
                severity=None if holds else ctx.version_severity(tv),
                rests_on=(key,),
            )


def _unread_after(a, prep):
    """Calls after `prep` that receive the prepared model and whose code the analysis did not read."""
    for t in a.timelines:
        ev = next((e for e in t.events if e.kind == "kbit_prep" and e.step.call is prep), None)
        if ev is not None and ev.entity is not None:
            found = a.unseen_after(t, ev, MAY_CAST, ev.entity, effect=CASTS)
            if found:
                return found
    return []


def _fix(ctx, a, call):
    stmt = call.stmt
    if stmt is None or len(call.targets) != 1 or call.star_kwargs():
        return None
    model = call.arg(0, "model")
    if model is None or ctx.code(model) != ctx.code(call.targets[0]):
        return None
    if not (len(stmt.node.body) == 1 and stmt.node.body[0].value is call.node):
        return None
    gc = call.kw("use_gradient_checkpointing")
    v = a.value(gc, call.scope) if gc is not None else True
    if v is UNKNOWN:
        return None
    if v is False:
        body = getattr(stmt.block, "body", ())
        if len(body) > 1:
            return unsafe("Drop prepare_model_for_kbit_training under FSDP", RemoveStatement(stmt.node))
        text = "pass"
    else:
        text = f'{ctx.code(model)}.gradient_checkpointing_enable(gradient_checkpointing_kwargs={{"use_reentrant": False}})'
    return unsafe("Drop prepare_model_for_kbit_training under FSDP", Replace(stmt.node.body[0], text))
