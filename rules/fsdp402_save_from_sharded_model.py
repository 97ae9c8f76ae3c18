from fsdplint import behaviour
from fsdplint.analysis.lightning import lightning_fsdp
from fsdplint.facts import MEASURED, Fact
from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._wrapped import fsdp1_one_unit, saves_no_weights, unwrapped_receiver


class SaveFromShardedModel(Rule):
    code = "FSDP402"
    name = "save-from-sharded-model"
    severity = Severity.ERROR
    sides = "SR"
    summary = (
        "adapter/model saved from a sharded model without a full-state-dict gather (unwrapped "
        "`.module.save_pretrained`/`.state_dict()`, `torch.save(model.state_dict())` under FSDP2): saves one shard"
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

    FSDP1 `state_dict()` outside a `state_dict_type` context: of the unwrapped model
    (`accelerator.unwrap_model(model)`, `model.module`), an error when the root is the only unit (no auto-wrap
    policy in the code, or accelerate's default `NO_WRAP` under an FSDP1 launch) and a warning with nested
    units; of the wrapper itself (`trainer.model`, the prepared or `FSDP(...)` model) in a function that writes
    a checkpoint and sets no `state_dict_type` anywhere, a warning: FSDP1's default FULL_STATE_DICT gathers
    the whole model, unoffloaded, on every rank's GPU.

    Under `fsdplint run --until save` the job runs past its first step to its first save (written to the
    run's own temporary directory), and what each simulated rank's save was given is judged: an adapter
    with no tensor or only empty ones (wherever it is written), and tensors smaller than the model's own
    (by the unsharded shapes FSDP1's flat parameters and FSDP2's DTensors hold) or sharded objects
    (DTensor, ShardedTensor) written to a path every rank shares or that one rank alone writes. A path of
    each rank's own, and `torch.distributed.checkpoint`, are sharded checkpoints by design and not reported.

    `save_pretrained()` (no `state_dict=`) of a peft model wrapped with FSDP1 outside a `state_dict_type`
    context, as one unit or with an auto-wrap policy (nested units): an error. Measured on CPU with 2 gloo
    ranks (`python bench/facts/fsdp402_nested_save_check.py`, torch 2.13.0, peft 0.21.2): one unit writes 8
    tensors, none of them the whole adapter weight; one unit per block, and peft's `fsdp_auto_wrap_policy`
    layout (every LoRA leaf its own unit), write an adapter with 0 tensors.

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
    torch >= 2.4 (FSDP2); `torch.distributed.checkpoint.state_dict` from torch 2.3. transformers 4.52 to
    5.0 gather each DTensor in `save_pretrained` (`full_tensor()` while writing the shards; read at 4.51.3
    and 4.52.1, and at 5.0.0 and 5.1.0, with `bench/facts/release_bisect.py`), so there
    `save_pretrained()` on every rank of an FSDP2 model writes the full weights and is not reported (on one
    rank only it hangs: FSDP401); transformers 5.1 to 5.23 gather nothing, and 5.24 gathers only models loaded with its own
    `distributed_config`. With an unknown transformers version the finding is a warning (see
    `fsdplint/behaviour.py`, `save_pretrained_gathers_dtensors`). Lightning: 2.1.0 made the Trainer's
    FSDPStrategy gather a full state dict (`lightning_module_state_dict`, #16558; read in 1.9.5, 2.0.0 and
    2.1.0); an unknown Lightning version is not reported.

    FSDP1 `state_dict()`, measured with `python bench/facts/fsdp402_cpu_check.py` (torch 2.13.0, CPU, 2 gloo ranks,
    one training step; accelerate 1.15 `extract_model_from_parallel` unwraps FSDP with `model.module`): with no
    auto-wrap policy, `model.module.state_dict()` holds only `_flat_param` (use_orig_params=False) or each
    weight as a 1-D slice or an empty tensor (use_orig_params=True: 2 and 3 of 11 keys intact on ranks 0 and 1,
    those that fall wholly in the rank's shard); with one unit per block, the blocks' 8 keys are gathered and
    the root's own 3 (embedding, head) are missing or sliced. The wrapper's `state_dict()` under the default
    type (`FullStateDictConfig(offload_to_cpu=False, rank0_only=False)`) holds all 2144 elements on both ranks;
    with `rank0_only=True` rank 1 holds none. accelerate 1.15 defaults `fsdp_auto_wrap_policy` to `NO_WRAP`
    (utils/dataclasses.py) and does not set a state-dict type on the prepared model.

    ## References
    - pytorch#122903, pytorch#143536; accelerate#2000, accelerate#4206
    - torchtitan docs/fsdp.md; AReaL#1000; axolotl#3772
    """
    references = ("pytorch#122903", "pytorch#143536", "accelerate#2000", "accelerate#4206")

    facts = (
        Fact("save_pretrained() of a peft model wrapped with FSDP1 (default FULL_STATE_DICT, no state_dict=) writes "
             "no whole adapter weight", "torch 2.13.0, peft 0.21.2", MEASURED,
             "2 gloo ranks: one unit, 8 tensors, 0 of 8 whole; one unit per block or per LoRA leaf (both "
             "use_orig_params settings that wrap), 0 tensors", "python bench/facts/fsdp402_nested_save_check.py"),
    )

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
        # Saved before sharding.
        """
        import torch
        from torch.distributed.fsdp import fully_shard
        torch.save(model.state_dict(), "init.pt")
        fully_shard(model)
        """,
    ]
    VALID += [
        # transformers 4.52-5.0 save_pretrained gathers each DTensor (full_tensor) while writing: called on
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
    VALID += [
        # accelerate FSDP1: get_state_dict gathers a full dict on every rank; rank 0 writes it.
        Valid(
            """
            from accelerate import Accelerator
            from transformers import AutoModelForCausalLM
            accelerator = Accelerator()
            net = AutoModelForCausalLM.from_pretrained(name)
            net, opt = accelerator.prepare(net, opt)
            train(net, opt)
            weights = accelerator.get_state_dict(net)
            accelerator.save(weights, "weights.pt")
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"},
        ),
        # The wrapper's state_dict() inside a FULL_STATE_DICT context offloaded to rank 0's CPU.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType, FullStateDictConfig
        net = FSDP(net, auto_wrap_policy=policy)
        train(net)
        cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        with FSDP.state_dict_type(net, StateDictType.FULL_STATE_DICT, cfg):
            weights = net.state_dict()
        if rank == 0:
            torch.save(weights, "weights.pt")
        """,
        # A checkpoint helper with an FSDP path (gathered to rank 0's CPU) and a plain one, chosen by a flag.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType, FullStateDictConfig

        def checkpoint(net, path, sharded):
            if sharded:
                cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
                with FSDP.state_dict_type(net, StateDictType.FULL_STATE_DICT, cfg):
                    weights = net.state_dict()
            else:
                weights = net.state_dict()
            torch.save(weights, path)

        net = FSDP(net, auto_wrap_policy=policy)
        checkpoint(net, "weights.pt", sharded=use_fsdp)
        """,
        # A state dict read to compare weights, not written: no checkpoint.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def unchanged(net, before):
            return all(torch.equal(v, before[k]) for k, v in net.state_dict().items())

        net = FSDP(net, auto_wrap_policy=policy)
        assert not unchanged(net, initial)
        """,
        # `.module` of a DDP model is the whole model on every rank.
        """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        net = DDP(net)
        train(net)
        torch.save(net.module.state_dict(), "weights.pt")
        """,
    ]
    INVALID = [
        # transformers 5.1-5.23 gather no DTensor in save_pretrained (read at 5.0.0 and 5.1.0): every rank writes
        # its shards.
        Invalid(
            """
            from torch.distributed.fsdp import fully_shard
            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model)
            train(model)
            model.save_pretrained("out")
            """,
            target={"transformers": "5.9.0"},
            line=6,
        ),
        # FSDP1 with nested units and the default FULL_STATE_DICT: measured on CPU (torch 2.13, peft 0.21.2,
        # bench/facts/fsdp402_nested_save_check.py), the adapter written holds 0 tensors, with one unit per
        # block and with peft's fsdp_auto_wrap_policy layout alike.
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, auto_wrap_policy=policy)
            model.save_pretrained("out", is_main_process=rank == 0)
            """,
            line=3,
        ),
        Invalid(
            """
            import functools
            from peft.utils.other import fsdp_auto_wrap_policy
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            def train(model, cfg):
                model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=True)
                step(model)
                model.save_pretrained(cfg.out)
            """,
            line=8,
        ),
        # accelerate's FSDP1 with no auto-wrap policy: the unwrapped model is the root unit's inner module,
        # whose parameters are this rank's flat shard.
        Invalid(
            """
            import torch
            from accelerate import Accelerator
            from transformers import AutoModelForCausalLM
            accelerator = Accelerator()
            net = AutoModelForCausalLM.from_pretrained(name)
            net, opt = accelerator.prepare(net, opt)
            train(net, opt)
            inner = accelerator.unwrap_model(net)
            torch.save(inner.state_dict(), "weights.pt")
            """,
            options={"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"},
            line=9,
        ),
        # The same through `.module` of a model wrapped by hand as one unit.
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            net = FSDP(net, use_orig_params=True)
            train(net)
            torch.save(net.module.state_dict(), "weights.pt")
            """,
            line=5,
        ),
        # Nested units: the blocks are gathered, the root's own embeddings and head are not (a warning).
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            net = FSDP(net, auto_wrap_policy=policy)
            train(net)
            torch.save(net.module.state_dict(), "weights.pt")
            """,
            line=5,
            severity="warning",
        ),
        # The wrapper's state_dict() under FSDP1's default: complete, but the whole model is gathered,
        # unoffloaded, on every rank's GPU (a warning).
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            net = FSDP(net, auto_wrap_policy=policy)
            train(net)
            weights = {k: v.cpu() for k, v in net.state_dict().items()}
            if rank == 0:
                torch.save(weights, "weights.pt")
            """,
            line=5,
            severity="warning",
        ),
    ]
    INVALID += [
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
                if ev.kind == "state_dict" and ev.data.get("method") == "state_dict":
                    _check_fsdp1_state_dict(ctx, a, t, ev, launch)
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
                    rests_on=("save_pretrained_gathers_dtensors",) if ev.kind == "save" and "FSDP2" in what else (),
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
            if not wraps or any(w.call is None or w.call.star_kwargs() for w in wraps):
                return None  # how it is wrapped is not written here
            if any(a.keyword(w.call, "auto_wrap_policy") is not None for w in wraps):
                # Measured (bench/facts/fsdp402_nested_save_check.py, torch 2.13, peft 0.21.2): with one unit
                # per block or per LoRA leaf the adapter file holds 0 tensors.
                return ("save_pretrained() on an FSDP1 model wrapped in nested units (measured: the adapter file "
                        "it writes holds 0 tensors)")
            return "save_pretrained() on an FSDP1 model wrapped as one unit"
        trainers = _trainer_model(ev)
        if state is None and (trainers or t.before(ev, ("prepare",))):
            # `kwargs["model"]` in a TrainerCallback event is the Trainer's (sharded) model
            # (behaviour `trainer_callback_gets_model`).
            by = "the Trainer" if trainers else "accelerate"
            if launch == 2:
                return f"save_pretrained() on a model {by} sharded with FSDP2"
            if launch == 1 and sharded_type:
                return "save_pretrained() under fsdp_state_dict_type SHARDED_STATE_DICT"
            if launch == 1 and not trainers and fsdp1_one_unit(a, t, ev) and unwrapped_receiver(
                    a, call.receiver, call.scope):
                return "save_pretrained() on accelerate's FSDP1 model wrapped as one unit (no auto-wrap policy)"
        return None


def _check_fsdp1_state_dict(ctx, a, t, ev, launch) -> None:
    """`.state_dict()` of an FSDP1 model outside a `state_dict_type` context (measured: bench/facts/fsdp402_cpu_check.py).

    Of the unwrapped model (`accelerator.unwrap_model(m)`, `m.module`): the root unit's own parameters are
    flat-parameter shards (`_flat_param`, or 1-D/empty views with use_orig_params=True) — none of the weights
    with no auto-wrap policy (an error), the root's own ones (embeddings, head) with one (a warning: a policy
    may wrap every module). Of the wrapper itself: FSDP1's default FULL_STATE_DICT gathers the full model,
    unoffloaded, on every rank (a warning: complete, but the whole model lands on each rank's device)."""
    call = ev.call
    if call is None or call.receiver is None or ev.entity is None or a.fsdp_branch(ev.step) is False:
        return  # (or in a branch that runs only without FSDP)
    if any(w for w in a.enclosing_withs(ev.step) if "state_dict_type" in a.code(w)) or a.method_calls(
            "set_state_dict_type"):
        return  # the code chose the state-dict type (FSDP401 judges a gather under a rank guard)
    state = t.wrap_state(ev.entity, ev.seq, at=ev)
    trainer = _trainer_model(ev)
    if state != "fsdp1" and not (state is None and launch == 1 and (trainer or t.before(ev, ("prepare",)))):
        return
    if unwrapped_receiver(a, call.receiver, call.scope):
        one = fsdp1_one_unit(a, t, ev)
        if one is None:
            return
        ctx.report(
            ev.node,
            "state_dict() of the unwrapped FSDP1 model (accelerate's unwrap_model strips the wrapper with .module) "
            "reads the root unit's parameters as its inner module holds them: flat-parameter shards of this rank "
            + ("— with no auto-wrap policy the whole model is that one unit, so the dict holds this rank's slice of "
               "it, not the weights (`_flat_param` alone, or with use_orig_params=True each weight as a 1-D slice "
               "or an empty tensor)"
               if one else "— the parameters the root unit holds itself (embeddings, final norm, head) are "
               "missing or 1-D/empty, while the nested units' are gathered")
            + "; the file loads later with missing keys. Gather with accelerator.get_state_dict(model) on every "
            "rank, or model.state_dict() under FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, "
            "FullStateDictConfig(offload_to_cpu=True, rank0_only=True)) on the wrapper, and let rank 0 write.",
            severity=None if one else Severity.WARNING,
        )
        return
    if a.rank_guard(ev.step) is not None:
        return  # a gather on some ranks only: FSDP401's hang
    if not any(c.method in _WRITERS or c.api == "torch_save" or (c.func or "").rsplit(".", 1)[-1] in _WRITERS
               for c in call.scope.calls):
        return  # a dict read to compare or load weights, not a checkpoint: its function writes nothing
    if any(c.method == "state_dict_type" for c in call.scope.calls):
        return  # the function gathers under a state_dict_type elsewhere: this is its path without FSDP
    ctx.report(
        ev.node,
        "state_dict() of an FSDP1 model with no state_dict_type set uses FSDP1's default FULL_STATE_DICT, "
        "FullStateDictConfig(offload_to_cpu=False, rank0_only=False): every rank gathers the full unsharded model "
        "onto its own GPU at once, which runs out of memory at save time once the model is near a GPU's size "
        "(the dict is complete; the memory is the problem). Gather under FSDP.state_dict_type(model, "
        "StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True, rank0_only=True)) — the full "
        "copy goes to rank 0's CPU only — or use accelerator.get_state_dict(model) / trainer.save_model().",
        severity=Severity.WARNING,
    )


# Calls that write a checkpoint (`torch.save`, `accelerator.save`, `trainer._save`, safetensors' `save_file`).
_WRITERS = frozenset({"save", "_save", "save_file", "save_model", "save_pretrained"})


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
