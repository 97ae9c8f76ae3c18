from fsdplint import behaviour
from fsdplint.analysis.lightning import lightning_fsdp
from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._wrapped import saves_no_weights


class SaveFromShardedModel(Rule):
    code = "FSDP402"
    name = "save-from-sharded-model"
    severity = Severity.ERROR
    sides = "S"
    summary = (
        "adapter/model saved from a sharded model without a full-state-dict gather (unwrapped "
        "`.module.save_pretrained`, `torch.save(model.state_dict())` under FSDP2): saves one shard"
    )
    versions = {"torch": ">=2.4"}
    doc = """
    ## What it does
    Finds checkpoints written straight from a sharded model: `torch.save(model.state_dict())` or
    `torch.save(get_peft_model_state_dict(model))` after `fully_shard`, `save_pretrained()` without
    `state_dict=` on an FSDP2 model, on an FSDP1 model wrapped without an auto-wrap policy (outside a
    `FULL_STATE_DICT` context), and on `accelerator.unwrap_model(model)` — or the Trainer's model, which
    every `TrainerCallback` event gets as `model=` — when accelerate shards with FSDP2 or with
    `fsdp_state_dict_type: SHARDED_STATE_DICT`; and checkpoints of Lightning's Trainer under
    `FSDPStrategy` before Lightning 2.1 (`ModelCheckpoint`, `trainer.save_checkpoint`, or the default
    checkpoint, a warning), which hold the unwrapped LightningModule's `state_dict()`, unless a strategy
    subclass overrides `lightning_module_state_dict`.

    ## Why is this bad?
    A sharded model's parameters are this rank's slices (FSDP2 DTensors, FSDP1 sharded flat-parameter
    views). Saving them directly writes one rank's shard — or an empty/garbage tensor — not the adapter.
    The file loads without error later and the model silently behaves as if it had not been trained.

    ## Example
    ```python
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    ...
    torch.save(model.state_dict(), "model.pt")
    ```

    ## Use instead
    ```python
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save(sd, "model.pt")
    ```
    FSDP1: `with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(...))`.
    accelerate: `save_pretrained(out, state_dict=accelerator.get_state_dict(model))`.

    ## Fix safety
    No automatic fix: the gather must run on every rank, and only rank 0 should write.

    ## Versions
    torch >= 2.4 (FSDP2); `torch.distributed.checkpoint.state_dict` from torch 2.3. transformers 4.51 to
    5.23 gather each DTensor in `save_pretrained` (`full_tensor()` while writing the shards), so there
    `save_pretrained()` on every rank of an FSDP2 model writes the full weights and is not reported (on one
    rank only it hangs: FSDP401); transformers 5.24 gathers only models loaded with its own
    `distributed_config`. With an unknown transformers version the finding is a warning (see
    `fsdplint/behaviour.py`, `save_pretrained_gathers_dtensors`). Lightning: 2.1.0 made the Trainer's
    FSDPStrategy gather a full state dict (`lightning_module_state_dict`, #16558; read in 1.9.5, 2.0.0 and
    2.1.0); an unknown Lightning version is not reported.

    ## References
    - pytorch#122903, pytorch#143536; accelerate#2000, accelerate#4206
    - torchtitan docs/fsdp.md; AReaL#1000; axolotl#3772
    """
    references = ("pytorch#122903", "pytorch#143536", "accelerate#2000", "accelerate#4206")

    VALID = [
        """
        import torch
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, StateDictOptions
        from torch.distributed.fsdp import fully_shard
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            torch.save(sd, "model.pt")
        """,
        """
        import torch.distributed.fsdp as f
        model = f.FullyShardedDataParallel(model)
        with f.FullyShardedDataParallel.state_dict_type(model, f.StateDictType.FULL_STATE_DICT):
            sd = model.state_dict()
            model.module.save_pretrained("out", state_dict=sd, is_main_process=rank == 0)
        """,
        Valid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, opt = accelerator.prepare(model, opt)
            unwrapped = accelerator.unwrap_model(model)
            unwrapped.save_pretrained(
                "out",
                is_main_process=accelerator.is_main_process,
                save_function=accelerator.save,
                state_dict=accelerator.get_state_dict(model),
            )
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"},
        ),
        # FSDP1 with nested units and the default FULL_STATE_DICT: the inner state_dict is gathered.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, auto_wrap_policy=policy)
        model.save_pretrained("out", is_main_process=rank == 0)
        """,
        # Saved before sharding.
        """
        import torch
        from torch.distributed.fsdp import fully_shard
        torch.save(model.state_dict(), "init.pt")
        fully_shard(model)
        """,
    ]
    VALID += [
        # transformers 4.51-5.23 save_pretrained gathers each DTensor (full_tensor) while writing: called on
        # every rank it writes the full weights.
        Valid(
            """
            from torch.distributed.fsdp import fully_shard
            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model)
            train(model)
            model.save_pretrained("out")
            """,
            target={"transformers": "4.57.1"},
        ),
        # The config of an FSDP2 model is a small JSON file: no shard in it.
        """
        from torch.distributed.fsdp import fully_shard
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        train(model)
        model.config.save_pretrained("out")
        tokenizer.save_pretrained("out")
        """,
        # Lightning >= 2.1 gathers a full state dict for the Trainer's checkpoints.
        Valid(
            """
            import lightning.pytorch as pl
            from lightning.pytorch.callbacks import ModelCheckpoint
            from lightning.pytorch.strategies import FSDPStrategy
            trainer = pl.Trainer(strategy=FSDPStrategy(auto_wrap_policy={Block}), callbacks=[ModelCheckpoint(dirpath=out)])
            trainer.fit(module)
            """,
            target={"lightning": "2.1.0"},
        ),
        # A strategy subclass that gathers the state dict itself (before Lightning 2.1).
        Valid(
            """
            import pytorch_lightning as pl
            from pytorch_lightning.strategies import FSDPStrategy
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType, FullStateDictConfig

            class GatheringFSDP(FSDPStrategy):
                def lightning_module_state_dict(self):
                    cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
                    with FSDP.state_dict_type(self.model, StateDictType.FULL_STATE_DICT, cfg):
                        return self.model.state_dict()

            pl.Trainer(strategy=GatheringFSDP(auto_wrap_policy={Block})).fit(module)
            """,
            target={"lightning": "2.0.0"},
        ),
    ]
    VALID += [
        # A callback that writes the tokenizer and the config reads no parameter.
        Valid(
            """
            from transformers import TrainerCallback

            class ExportExtras(TrainerCallback):
                def on_save(self, args, state, control, **kwargs):
                    kwargs["processing_class"].save_pretrained(args.output_dir)
                    kwargs["model"].config.save_pretrained(args.output_dir)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"},
            target={"transformers": "5.24.0"},
        ),
    ]
    INVALID = [
        # A TrainerCallback gets the Trainer's own model as `model=`: sharded under FSDP.
        Invalid(
            """
            import os
            from transformers import TrainerCallback

            class KeepAdapter(TrainerCallback):
                def on_save(self, args, state, control, **kwargs):
                    folder = os.path.join(args.output_dir, f"step-{state.global_step}")
                    kwargs["model"].save_pretrained(folder)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"},
            target={"transformers": "5.24.0"},
            line=7,
        ),
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard
            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model)
            train(model)
            torch.save(model.state_dict(), "model.pt")
            """,
            line=7,
        ),
        Invalid(
            """
            import torch.distributed._composable.fsdp as fsdp2
            from peft import get_peft_model as add_lora

            def main():
                model = add_lora(base, cfg)
                for block in model.base_model.model.model.layers:
                    fsdp2.fully_shard(block)
                fsdp2.fully_shard(model)
                model.save_pretrained("adapter")
            """,
            target={"transformers": "5.24.0"},
            line=9,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, use_orig_params=True)
            model.module.save_pretrained("out")
            """,
            line=3,
        ),
        Invalid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, opt = accelerator.prepare(model, opt)
            accelerator.unwrap_model(model).save_pretrained("out", is_main_process=accelerator.is_main_process)
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"
                                          "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"},
            line=4,
        ),
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard
            from peft import get_peft_model_state_dict
            fully_shard(model)
            torch.save(get_peft_model_state_dict(model), "adapter.bin")
            """,
            line=5,
        ),
        # Lightning 2.0's Trainer saves the unwrapped LightningModule's state under FSDPStrategy.
        Invalid(
            """
            import pytorch_lightning as pl
            from pytorch_lightning.callbacks import ModelCheckpoint
            from pytorch_lightning.strategies import FSDPStrategy

            saver = ModelCheckpoint(dirpath="ckpt", save_weights_only=True)
            trainer = pl.Trainer(strategy=FSDPStrategy(auto_wrap_policy={Block}), callbacks=[saver])
            trainer.fit(module)
            """,
            target={"lightning": "2.0.0"},
            line=5,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        _check_lightning_checkpoint(ctx)
        launch = getattr(a, "launch_fsdp_version", None)
        facts = getattr(a, "launch", None)
        sharded_type = facts is not None and "SHARDED" in str(facts.value("state_dict_type", "")).upper()
        for t in a.timelines:
            for ev in t.events:
                if ev.entity is None or (ev.ref is not None and ev.ref.child):
                    continue
                what = self._saved(a, t, ev, launch, sharded_type)
                if what is None or a.fsdp_branch(ev.step) is False:
                    continue
                severity = None
                if ev.kind == "save" and saves_no_weights(a, ev):
                    continue
                if ev.kind == "save" and "FSDP2" in what and a.rank_guard(ev.step) is not None and behaviour.holds(
                        "save_pretrained_gathers_dtensors", ctx.version("transformers")):
                    continue  # a gather on one rank only: FSDP401's hang
                if ev.kind == "save" and "FSDP2" in what and a.rank_guard(ev.step) is None:
                    # On every rank: transformers releases that gather each DTensor in save_pretrained write
                    # the full weights (on one rank only it is FSDP401's hang).
                    gathers = behaviour.holds("save_pretrained_gathers_dtensors", ctx.version("transformers"))
                    if gathers:
                        continue
                    if gathers is None:
                        severity = ctx.version_severity(ctx.version("transformers"))
                ctx.report(
                    ev.node,
                    f"{what} reads the parameters of a sharded model, so it writes this rank's shard (or an "
                    "empty view), not the trained weights; the file loads later without error. Gather a full "
                    "state dict first — FSDP2: get_model_state_dict(model, options=StateDictOptions("
                    "full_state_dict=True)); FSDP1: FSDP.state_dict_type(model, FULL_STATE_DICT); accelerate: "
                    "accelerator.get_state_dict(model) — and pass it as state_dict=."
                    + (f" (transformers {behaviour.BEHAVIOURS['save_pretrained_gathers_dtensors'].since} to "
                       f"{behaviour.BEHAVIOURS['save_pretrained_gathers_dtensors'].until} gather the DTensors in "
                       f"save_pretrained themselves; the target is {ctx.version('transformers').describe()}: "
                       f"{ctx.version('transformers').declare_hint('5.24')}.)" if severity is not None else ""),
                    severity=severity,
                )

    @staticmethod
    def _saved(a, t, ev, launch, sharded_type):
        call = ev.call
        if call is None:
            return None
        state = t.wrap_state(ev.entity, ev.seq, at=ev)
        if ev.kind == "torch_save_state_dict":
            return "torch.save(model.state_dict())" if state == "fsdp2" else None
        if ev.kind == "state_dict" and ev.data.get("api") == "get_peft_model_state_dict":
            return "torch.save(get_peft_model_state_dict(model))" if state == "fsdp2" and _in_torch_save(a, call) else None
        if ev.kind != "save" or a.keyword(call, "state_dict") is not None:
            return None
        if a.rank_guard(ev.step) is not None and state == "fsdp1":
            return None  # a collective under a rank guard: FSDP401's finding
        if any(_full_context(a, w) for w in a.enclosing_withs(ev.step)) or a.method_calls("set_state_dict_type"):
            return None
        if state == "fsdp2":
            return "save_pretrained() on an FSDP2 model"
        if state == "fsdp1":
            wraps = [w for w in t.before(ev, ("wrap1",)) if w.ref is not None and not w.ref.child]
            nested = any(w.call is None or a.keyword(w.call, "auto_wrap_policy") is not None or w.call.star_kwargs()
                         for w in wraps)
            return None if nested or not wraps else "save_pretrained() on an FSDP1 model wrapped as one unit"
        trainers = _trainer_model(ev)
        if state is None and (trainers or t.before(ev, ("prepare",))):
            # `kwargs["model"]` in a TrainerCallback event is the Trainer's (sharded) model
            # (behaviour `trainer_callback_gets_model`).
            by = "the Trainer" if trainers else "accelerate"
            if launch == 2:
                return f"save_pretrained() on a model {by} sharded with FSDP2"
            if launch == 1 and sharded_type:
                return "save_pretrained() under fsdp_state_dict_type SHARDED_STATE_DICT"
        return None


def _trainer_model(ev) -> bool:
    """The event's model is the Trainer's own (`trainer.model`, a callback's `model=`)."""
    return ev.ref is not None and ev.ref.key.rsplit(":", 1)[-1] == "trainer.model"


def _in_torch_save(a, call) -> bool:
    return any(c.api == "torch_save" and any(arg.value is call.node for arg in c.node.args) for c in a.calls("torch_save"))


def _full_context(a, expr) -> bool:
    """`with FSDP.state_dict_type(m, FULL_STATE_DICT, ...)` (or one whose type the linter cannot read)."""
    import libcst as cst

    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)
            and expr.func.attr.value == "state_dict_type"):
        return False
    text = a.code(expr)
    return "SHARDED" not in text and "LOCAL" not in text


def _check_lightning_checkpoint(ctx) -> None:
    """Lightning's Trainer under FSDPStrategy before 2.1 checkpoints the unwrapped LightningModule's
    state_dict() (behaviour.py `lightning_fsdp_full_checkpoint`): the weights FSDP flattened into the root
    unit are missing. A strategy subclass that overrides lightning_module_state_dict gathers its own."""
    a = ctx.analysis
    for lf in lightning_fsdp(a, ctx):
        if lf.kind != "trainer" or "lightning_module_state_dict" in lf.overrides:
            continue
        lv = ctx.version("lightning")
        if not lf.legacy and behaviour.holds("lightning_fsdp_full_checkpoint", lv) is not False:
            continue  # Lightning >= 2.1 gathers a full state dict (or the version is not known)
        writers = a.calls("lightning_ModelCheckpoint") or [
            c for c in a.method_calls("save_checkpoint") if a.is_trainer(c.receiver)]
        enabled = lf.host.kw("enable_checkpointing")
        if not writers and enabled is not None and a.value(enabled, lf.host.scope) is False:
            continue
        where = ("this checkpoint" if writers else
                 "the checkpoint the Trainer writes by default (enable_checkpointing=True adds a ModelCheckpoint)")
        version = (f'strategy="{lf.name}" (Lightning < 2.0)' if lf.legacy else lv.describe())
        ctx.report(
            writers[0].node if writers else lf.host.node,
            severity=None if writers else Severity.WARNING,  # a default checkpoint the job may never load
            message=
            f"Under FSDPStrategy, {version} saves in {where} the state_dict() of the unwrapped LightningModule, "
            f"not a gathered one: the weights FSDP flattened into the root unit are missing and loading it reports "
            f"missing keys. Lightning 2.1 gathers a full state dict (state_dict_type=\"full\"); before it, "
            f"subclass FSDPStrategy and override lightning_module_state_dict to gather under "
            f"FSDP.state_dict_type(self.model, FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)).",
        )
        return
