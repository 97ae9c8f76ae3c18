from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid

_YAML_SHARDED = """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 1
  fsdp_state_dict_type: SHARDED_STATE_DICT
"""
_YAML_FULL = _YAML_SHARDED.replace("SHARDED_STATE_DICT", "FULL_STATE_DICT")


class SaveModelShardedStateDict(Rule):
    code = "FSDP404"
    name = "save-model-sharded-state-dict"
    severity = Severity.ERROR
    sides = "SR"
    summary = (
        "`trainer.save_model()` under FSDP with `state_dict_type: SHARDED_STATE_DICT`: the Trainer writes no "
        "loadable model or adapter"
    )
    versions = {"transformers": ">=4.39"}
    doc = """
    ## What it does
    Finds `trainer.save_model(...)` in a script whose FSDP launch (accelerate YAML
    `fsdp_state_dict_type`, `TrainingArguments(fsdp_config={"state_dict_type": ...})` or
    `FullyShardedDataParallelPlugin(state_dict_type=...)`) asks for `SHARDED_STATE_DICT` (or
    `LOCAL_STATE_DICT`), when the script does not switch the plugin to `FULL_STATE_DICT` before saving.

    Under `fsdplint run --until save`, when the job's first save after its first step is its own
    `trainer.save_model()` and rank 0's call wrote no weights under a state-dict type other than
    `FULL_STATE_DICT`, the run reports it at that call.

    ## Why is this bad?
    Under FSDP, `Trainer.save_model()` gathers and writes weights only when the plugin's state-dict type
    is `FULL_STATE_DICT` (`if "FULL_STATE_DICT" in str(...fsdp_plugin.state_dict_type)` in
    transformers' `save_model`, 4.57.6 and 5.24.0 alike). With a sharded type it writes no
    `model.safetensors` and no `adapter_model.safetensors`: the only weights on disk are the sharded
    `pytorch_model_fsdp_0/` directories inside the `checkpoint-*` folders, which `from_pretrained` /
    `PeftModel.from_pretrained` cannot load. The run "succeeds" and the final model is missing.

    ## Example
    ```python
    # fsdp.yaml: fsdp_state_dict_type: SHARDED_STATE_DICT
    trainer.train()
    trainer.save_model("out")
    ```

    ## Use instead
    ```python
    trainer.train()
    if trainer.is_fsdp_enabled:
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model("out")   # on every rank: the gather is a collective
    ```
    Or set `fsdp_state_dict_type: FULL_STATE_DICT` for the run (intermediate checkpoints are then full
    too), or convert a sharded checkpoint afterwards with `accelerate merge-weights`.

    ## Fix safety
    No automatic fix: FULL_STATE_DICT gathers the whole model on rank 0's CPU, which may not fit for very
    large models; the user chooses between switching before the final save and merging offline.

    ## Versions
    Reported on transformers 4.39.2 (transformers#30491); transformers 4.57.6 and 5.24.0 `save_model` still
    write weights only under FULL_STATE_DICT (read in their sources). accelerate's `set_state_dict_type`
    read in 1.15.

    ## References
    - transformers#30491 ("Trainer/accelerate doesn't save model when using FSDP with SHARDED_STATE_DICT")
    - transformers src trainer.py (`save_model`); accelerate src utils/dataclasses.py
      (`FullyShardedDataParallelPlugin.set_state_dict_type`); accelerate docs usage_guides/fsdp.md
    """
    references = ("transformers#30491",)

    VALID = [
        # The plugin is switched to FULL_STATE_DICT before the final save.
        Valid(
            """
            from transformers import Trainer
            trainer = Trainer(model=model, args=args, train_dataset=ds)
            trainer.train()
            if trainer.is_fsdp_enabled:
                trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
            trainer.save_model("out")
            """,
            options={"accelerate_config": _YAML_SHARDED},
        ),
        # FULL_STATE_DICT for the whole run.
        Valid(
            """
            from transformers import Trainer
            trainer = Trainer(model=model, args=args, train_dataset=ds)
            trainer.train()
            trainer.save_model("out")
            """,
            options={"accelerate_config": _YAML_FULL},
        ),
        # A project's own trainer wrapper whose save_model takes other arguments (it saves its own way).
        Valid(
            """
            from myproject.trainers import build_trainer
            trainer = build_trainer(model, args)
            trainer.train()
            trainer.save_model(config=config, final=True)
            """,
            options={"accelerate_config": _YAML_SHARDED},
        ),
        # Sharded checkpoints only, merged offline: no save_model call.
        Valid(
            """
            from transformers import Trainer
            trainer = Trainer(model=model, args=args, train_dataset=ds)
            trainer.train()
            trainer.save_state()
            """,
            options={"accelerate_config": _YAML_SHARDED},
        ),
        # The plugin attribute set directly.
        Valid(
            """
            from torch.distributed.fsdp import StateDictType
            from transformers import Trainer
            trainer = Trainer(model=model, args=args, train_dataset=ds)
            trainer.train()
            trainer.accelerator.state.fsdp_plugin.state_dict_type = StateDictType.FULL_STATE_DICT
            trainer.save_model("out")
            """,
            options={"accelerate_config": _YAML_SHARDED},
        ),
        # No FSDP: save_model writes the model.
        """
        from transformers import Trainer, TrainingArguments
        trainer = Trainer(model=model, args=TrainingArguments("out"), train_dataset=ds)
        trainer.train()
        trainer.save_model("out")
        """,
    ]
    INVALID = [
        Invalid(
            """
            from transformers import Trainer
            trainer = Trainer(model=model, args=args, train_dataset=ds)
            trainer.train()
            trainer.save_model("out")
            """,
            options={"accelerate_config": _YAML_SHARDED},
            line=4,
        ),
        Invalid(
            """
            from transformers import TrainingArguments
            from trl import SFTTrainer
            args = TrainingArguments(
                "out",
                fsdp="full_shard auto_wrap",
                fsdp_config={"state_dict_type": "SHARDED_STATE_DICT", "version": 2},
            )
            trainer = SFTTrainer(model=model, args=args, train_dataset=ds, peft_config=lora)
            trainer.train()
            trainer.save_model(args.output_dir)
            """,
            line=10,
        ),
        Invalid(
            """
            from transformers import Trainer

            def finish(trainer, out):
                trainer.save_model(out)

            def main():
                trainer = Trainer(model=model, args=args)
                trainer.train()
                finish(trainer, "final")
            """,
            options={"accelerate_config": _YAML_SHARDED},
            line=4,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        facts = getattr(a, "launch", None)
        if facts is None or facts.fsdp_version is None:
            return
        kind = str(facts.value("state_dict_type", "") or "").upper()
        if "SHARDED" not in kind and "LOCAL" not in kind:
            return
        if _switched_to_full(a):
            return
        for call in a.method_calls("save_model"):
            if not a.is_trainer(call.receiver) or not _fits_trainer_save_model(call.node):
                continue
            ctx.report(
                call.node,
                f"trainer.save_model() under FSDP with state_dict_type {kind.split('.')[-1]} writes no model and no "
                "adapter: the Trainer gathers and saves weights only under FULL_STATE_DICT, so only the sharded "
                "pytorch_model_fsdp_0/ checkpoint directories exist and from_pretrained cannot load them. Before "
                "saving, call trainer.accelerator.state.fsdp_plugin.set_state_dict_type(\"FULL_STATE_DICT\") (on "
                "every rank), or set fsdp_state_dict_type: FULL_STATE_DICT, or merge the shards with "
                "`accelerate merge-weights`.",
            )


# `Trainer.save_model(self, output_dir=None, _internal_call=False)` (transformers 4.39 to 5.24 alike).
_SAVE_MODEL_KEYWORDS = {"output_dir", "_internal_call"}


def _fits_trainer_save_model(node) -> bool:
    """A call the Trainer's `save_model` accepts: a keyword it does not have, or a third positional argument,
    is another class's method (a project's trainer wrapper, `trainer.save_model(config=config)`)."""
    positional = [a for a in node.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value for a in node.args if a.keyword is not None}
    return len(positional) <= 2 and keywords <= _SAVE_MODEL_KEYWORDS


def _switched_to_full(a) -> bool:
    """`...fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")` or `...fsdp_plugin.state_dict_type = ...FULL...`
    (or a type the linter cannot read) somewhere."""
    for call in a.method_calls("set_state_dict_type"):
        text = a.code(call.node)
        if "SHARDED" not in text and "LOCAL" not in text:
            return True
    for scope in a.c.scopes:
        for item in scope.attr_sets:
            if item.key is None and item.target.endswith("fsdp_plugin.state_dict_type"):
                text = a.code(item.value)
                if "SHARDED" not in text and "LOCAL" not in text:
                    return True
    return False
