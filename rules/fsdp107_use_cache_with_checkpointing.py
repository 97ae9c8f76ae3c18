from fsdplint import behaviour
from fsdplint.analysis import UNKNOWN
from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import InsertLinesAfter, safe
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._checkpointing import fsdp_checkpointing, hf_checkpointing, uses_trl

YAML_AC = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_activation_checkpointing: true
  fsdp_version: 1
num_processes: 8
"""


class UseCacheWithCheckpointing(Rule):
    code = "FSDP107"
    name = "use-cache-with-checkpointing"
    severity = Severity.ERROR
    summary = "`use_cache` left on while FSDP activation checkpointing is enabled."
    sides = "S"
    fix = Applicability.SAFE
    doc = """
    ## What it does
    Finds FSDP activation checkpointing (`apply_activation_checkpointing`, `checkpoint_wrapper`,
    `activation_checkpointing` in an accelerate `fsdp_config` / `TrainingArguments(fsdp_config=...)`, or
    Lightning's `FSDPStrategy(activation_checkpointing_policy=...)` / `activation_checkpointing=`) on a
    transformers model whose KV cache is still on: no `model.config.use_cache = False`, no
    `use_cache=False` passed to `from_pretrained` or the forward call.

    ## Why is this bad?
    transformers turns the cache off during training only when *its own* gradient-checkpointing flag is
    set. FSDP's checkpoint wrappers do not set it, so every decoder layer appends its keys/values to a
    `DynamicCache` in the forward pass and again when the layer is recomputed in backward. The recomputed
    tensors then have a different shape (the sequence dimension doubled) and backward fails with
    `torch.utils.checkpoint.CheckpointError: Recomputed values for the following tensors have different
    metadata`.

    Not reported: trl trainers (they pass `use_cache=False` in the training forward), the transformers
    `Trainer` from v5 on (it sets `model.config.use_cache = TrainingArguments.use_cache`, default False),
    and scripts that also enable Hugging Face gradient checkpointing (which disables the cache).

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained(name)
    model = FSDP(model, auto_wrap_policy=policy)
    apply_activation_checkpointing(model, check_fn=is_decoder_layer)
    ```

    ## Use instead
    ```python
    model = AutoModelForCausalLM.from_pretrained(name)
    model.config.use_cache = False
    ```

    ## Fix safety
    Safe for training: the cache is only useful for generation. The fix inserts
    `model.config.use_cache = False` right after the model is loaded; set it back to True before
    generating or saving a model meant for inference.

    ## Versions
    transformers >= 4.36, where decoder layers write into a `DynamicCache` (4.35.2 returned fresh key/value
    tuples, nothing to append twice; `fsdplint/behaviour.py`, `transformers_kv_cache_object`: 4.36.0 moved
    Llama/Mistral/Mixtral, other architectures later). The transformers `Trainer` sets `use_cache=False`
    itself from v5.0 (transformers#41585).

    ## References
    - Lightning-AI/pytorch-lightning#19267
    - transformers#34928, #28499, #41585
    - transformers modeling code ("`use_cache=True` is incompatible with gradient checkpointing")
    """
    references = ("transformers#34928", "transformers#28499")

    VALID = [
        """
        from transformers import AutoModelForCausalLM
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
        model = AutoModelForCausalLM.from_pretrained(name)
        model.config.use_cache = False
        model = FSDP(model, auto_wrap_policy=policy)
        apply_activation_checkpointing(model, check_fn=check_fn)
        """,
        """
        from transformers import AutoModelForCausalLM as Auto
        import torch.distributed.fsdp as f
        from torch.distributed.algorithms._checkpoint import checkpoint_wrapper as cw
        model = Auto.from_pretrained(name, use_cache=False)
        model = f.FullyShardedDataParallel(model)
        cw.apply_activation_checkpointing(model, check_fn=check_fn)
        """,
        # No activation checkpointing at all.
        """
        from transformers import AutoModelForCausalLM
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = AutoModelForCausalLM.from_pretrained(name)
        model = FSDP(model, auto_wrap_policy=policy)
        """,
        # trl passes use_cache=False in its training forward.
        Valid(
            """
            from trl import SFTConfig, SFTTrainer
            args = SFTConfig(output_dir="out")
            trainer = SFTTrainer(model="meta-llama/Llama-3.1-8B", args=args)
            """,
            options={"accelerate_config": YAML_AC},
        ),
        # The transformers 5 Trainer turns the cache off itself.
        Valid(
            """
            from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
            model = AutoModelForCausalLM.from_pretrained(name)
            args = TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap",
                                     fsdp_config={"activation_checkpointing": True})
            Trainer(model=model, args=args).train()
            """,
            target={"transformers": "5.1"},
        ),
        # Layers returned fresh (key, value) tuples before transformers 4.36: nothing is appended on recompute.
        Valid(
            """
            from transformers import AutoModelForSeq2SeqLM
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(AutoModelForSeq2SeqLM.from_pretrained(name), auto_wrap_policy=policy)
            apply_activation_checkpointing(model, check_fn=is_block)
            """,
            target={"transformers": "4.27.1"},
        ),
        # Lightning's strategy checkpoints the blocks; the cache is turned off after loading.
        Valid(
            """
            import lightning.pytorch as pl
            from lightning.pytorch.strategies import FSDPStrategy
            from transformers import AutoModelForCausalLM

            class LM(pl.LightningModule):
                def configure_model(self):
                    self.model = AutoModelForCausalLM.from_pretrained(name)
                    self.model.config.use_cache = False

            pl.Trainer(strategy=FSDPStrategy(activation_checkpointing_policy={DecoderLayer})).fit(LM())
            """,
        ),
    ]
    INVALID = [
        Invalid(
            """
            from transformers import AutoModelForCausalLM
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
            model = AutoModelForCausalLM.from_pretrained(name)
            model = FSDP(model, auto_wrap_policy=policy)
            apply_activation_checkpointing(model, check_fn=check_fn)
            """,
            line=6,
            expected_fix="""
            from transformers import AutoModelForCausalLM
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
            model = AutoModelForCausalLM.from_pretrained(name)
            model.config.use_cache = False
            model = FSDP(model, auto_wrap_policy=policy)
            apply_activation_checkpointing(model, check_fn=check_fn)
            """,
        ),
        # accelerate YAML: the finding points at the YAML line.
        Invalid(
            """
            import transformers as tf
            from accelerate import Accelerator
            accelerator = Accelerator()
            model = tf.AutoModelForCausalLM.from_pretrained(name)
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            options={"accelerate_config": YAML_AC},
        ),
        Invalid(
            """
            from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
            model = AutoModelForCausalLM.from_pretrained(name)
            args = TrainingArguments(
                output_dir="out",
                fsdp="full_shard auto_wrap",
                fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "activation_checkpointing": True},
            )
            Trainer(model=model, args=args).train()
            """,
            line=6,
            target={"transformers": "4.46"},
            expected_fix="""
            from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
            model = AutoModelForCausalLM.from_pretrained(name)
            model.config.use_cache = False
            args = TrainingArguments(
                output_dir="out",
                fsdp="full_shard auto_wrap",
                fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "activation_checkpointing": True},
            )
            Trainer(model=model, args=args).train()
            """,
        ),
        # The model config explicitly keeps the cache on.
        Invalid(
            """
            from transformers import AutoModelForCausalLM
            from torch.distributed.fsdp import fully_shard
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
            model = AutoModelForCausalLM.from_pretrained(name)
            model.config.use_cache = True
            for i, layer in enumerate(model.model.layers):
                model.model.layers[i] = checkpoint_wrapper(layer)
                fully_shard(model.model.layers[i])
            fully_shard(model)
            """,
            line=7,
        ),
        # Lightning's FSDPStrategy applies the checkpoint wrappers (activation_checkpointing_policy).
        Invalid(
            """
            import pytorch_lightning as pl
            from pytorch_lightning.strategies import FSDPStrategy
            from transformers import AutoModelForCausalLM

            class LM(pl.LightningModule):
                def __init__(self):
                    super().__init__()
                    self.model = AutoModelForCausalLM.from_pretrained(name)

            strategy = FSDPStrategy(auto_wrap_policy={DecoderLayer}, activation_checkpointing_policy={DecoderLayer})
            pl.Trainer(strategy=strategy).fit(LM())
            """,
            line=10,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        sites = fsdp_checkpointing(a)
        if not sites or uses_trl(a) or hf_checkpointing(a):
            return
        loads = a.calls("load_model")
        trainers = a.calls("Trainer")
        if not loads and not trainers:
            return  # not a transformers model: no KV cache to worry about
        if _cache_off(a):
            return
        tv = ctx.version("transformers")
        if behaviour.holds("transformers_kv_cache_object", tv) is False:
            return  # layers return fresh (key, value) tuples: a recomputed layer appends to nothing
        if trainers and tv >= "5.0":
            return  # the Trainer applies TrainingArguments.use_cache (default False)
        # Through a Trainer the bug needs transformers < 5: only as sure as that version is known.
        severity = ctx.version_severity(tv) if trainers else None
        fix = _fix(a, loads)
        for s in sites:
            msg = (
                "FSDP activation checkpointing is on but the model's KV cache (use_cache) is not turned off: "
                "transformers only disables it for its own gradient checkpointing, so each recomputed layer "
                "appends to the cache again and backward fails with CheckpointError (recomputed tensors have "
                "different metadata). Set model.config.use_cache = False for training."
            )
            if severity is not None:
                msg += f" (The Trainer turns the cache off itself from transformers 5.0: {tv.declare_hint('5.0')}.)"
            if s.setting is not None:
                ctx.report_setting(s.setting, msg, fix=fix if s.setting.node is not None else None, severity=severity,
                                   rests_on=("transformers_kv_cache_object",))
            else:
                ctx.report(s.node, msg, fix=fix, severity=severity, rests_on=("transformers_kv_cache_object",))


def _cache_off(a) -> bool:
    for ev in a.events("use_cache"):
        if ev.data.get("value") is not True:
            return True  # False, or a value we cannot read: assume the author handles it
    for c in a.c.calls:
        expr = c.kw("use_cache")
        if expr is not None and a.value(expr, c.scope) is not True:
            return True
    return False


def _fix(a, loads):
    """Insert `<model>.config.use_cache = False` after the single statement that loads the model."""
    if len(loads) != 1:
        return None
    load = loads[0]
    if not load.targets or load.stmt is None or len(load.targets) != 1:
        return None
    target = a.code(load.targets[0])
    if not target.replace(".", "").replace("_", "").isalnum():
        return None
    if any(ev.data.get("value") is True for ev in a.events("use_cache")):
        return None
    return safe("Set use_cache = False after loading the model", InsertLinesAfter(load.stmt.node, f"{target}.config.use_cache = False"))
