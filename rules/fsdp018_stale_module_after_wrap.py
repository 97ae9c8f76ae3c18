from fsdplint.findings import Severity
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid

_USES = ("generate", "save", "merge", "state_dict")
_LABEL = {"generate": "generate()", "save": "save_pretrained()", "merge": "merge_and_unload()/merge_adapter()",
          "state_dict": "state_dict()"}
_YAML_FSDP1 = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"


class StaleModuleAfterWrap(Rule):
    code = "FSDP018"
    name = "stale-module-after-wrap"
    severity = Severity.ERROR
    sides = "S"
    summary = (
        "the pre-wrap model reference used after FSDP1 wrapping (`fsdp_model = FSDP(model)`, `trainer.train()`, "
        "`accelerator.prepare`): its parameters are sharded views"
    )
    versions = {"torch": ">=2.0"}
    doc = """
    ## What it does
    Finds `generate()`, `save_pretrained()`, `merge_and_unload()` or `state_dict()` called through the name
    a model had before FSDP1 wrapped it under another name: `fsdp_model = FSDP(model)` then
    `model.generate(...)`; `wrapped = accelerator.prepare(model)` then `model.save_pretrained(...)`
    (FSDP1 launch); `trainer = Trainer(model=model, ...)`, `trainer.train()` then
    `model.save_pretrained(...)` or `model.generate(...)` (FSDP1 launch). `generate()` after a direct wrap is
    FSDP108's finding.

    ## Why is this bad?
    FSDP1 does not copy the model: the wrapper owns the same submodules, and after wrapping their
    parameters are views into this rank's shard of a FlatParameter, gathered only inside the wrapper's
    forward. Through the old reference nothing gathers them: `generate()` fails with `RuntimeError:
    'weight' must be 2-D` (or a size mismatch), `state_dict()` / `save_pretrained()` write this rank's
    shard or empty tensors, and a merge adds the adapter to shards (pytorch#111958).

    ## Example
    ```python
    fsdp_model = FSDP(model, auto_wrap_policy=policy)
    train(fsdp_model)
    model.save_pretrained("out")
    ```

    ## Use instead
    Use the wrapped object and gather as the framework requires:
    ```python
    with FSDP.state_dict_type(fsdp_model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
        sd = fsdp_model.state_dict()
    model.save_pretrained("out", state_dict=sd, is_main_process=rank == 0)
    ```
    After `trainer.train()`: `trainer.save_model()` / `trainer.model`; with accelerate:
    `accelerator.unwrap_model(wrapped).save_pretrained(out, state_dict=accelerator.get_state_dict(wrapped))`;
    for generation, `with FSDP.summon_full_params(fsdp_model, writeback=False):` (FSDP108).

    ## Fix safety
    No automatic fix: the gather depends on the FSDP state-dict settings and must run on every rank.

    ## Versions
    All torch versions with FSDP1. FSDP2 (`fully_shard`) changes the module in place, so there is no
    stale name; its sharded generate/save are FSDP108/FSDP402.

    ## References
    - pytorch#111958; pytorch#100069 ("'weight' must be 2-D")
    - transformers src trainer.py ("self.model is the Transformers Model except when we are using FSDP")
    """
    references = ("pytorch#111958", "pytorch#100069")

    VALID = [
        # The wrapped object is used, inside a full-parameter context.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        fsdp_model = FSDP(model, use_orig_params=True)
        with FSDP.summon_full_params(fsdp_model, writeback=False, recurse=False):
            out = fsdp_model.generate(**inputs)
        """,
        # The name is rebound to the wrapper.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, auto_wrap_policy=policy)
        train(model)
        """,
        # The gathered state dict is passed to the old reference's save_pretrained.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType, FullStateDictConfig
        fsdp_model = FSDP(model, auto_wrap_policy=policy)
        train(fsdp_model)
        with FSDP.state_dict_type(fsdp_model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
            sd = fsdp_model.state_dict()
        model.save_pretrained("out", state_dict=sd, is_main_process=rank == 0)
        """,
        # Trainer: save through the trainer.
        Valid(
            """
            from transformers import Trainer
            trainer = Trainer(model=model, args=args, train_dataset=ds)
            trainer.train()
            trainer.save_model("out")
            out = trainer.model.config
            """,
            options={"accelerate_config": _YAML_FSDP1},
        ),
        # accelerate: unwrap the prepared model and gather its state dict.
        Valid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            wrapped, opt = accelerator.prepare(model, opt)
            unwrapped = accelerator.unwrap_model(wrapped)
            unwrapped.save_pretrained("out", state_dict=accelerator.get_state_dict(wrapped))
            """,
            options={"accelerate_config": _YAML_FSDP1},
        ),
        # Used before wrapping.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        sample = model.generate(**inputs)
        fsdp_model = FSDP(model)
        """,
        # No FSDP: the Trainer's model is the user's model.
        """
        from transformers import Trainer, TrainingArguments
        trainer = Trainer(model=model, args=TrainingArguments("out"))
        trainer.train()
        model.save_pretrained("out")
        """,
    ]
    INVALID = [
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            fsdp_model = FSDP(model, auto_wrap_policy=policy)
            train(fsdp_model)
            model.save_pretrained("out", safe_serialization=True)
            """,
            line=4,
        ),
        Invalid(
            """
            from transformers import Trainer
            trainer = Trainer(model=model, args=args, train_dataset=ds)
            trainer.train()
            model.save_pretrained("out")
            """,
            options={"accelerate_config": _YAML_FSDP1},
            line=4,
        ),
        Invalid(
            """
            from transformers import Trainer
            trainer = Trainer(model=model, args=args, train_dataset=ds)
            trainer.train()
            sample = model.generate(**tokenizer("Hello", return_tensors="pt"), max_new_tokens=20)
            """,
            options={"accelerate_config": _YAML_FSDP1},
            line=4,
        ),
        Invalid(
            """
            from accelerate import Accelerator

            def main(model, opt):
                accelerator = Accelerator()
                ddp_model, opt = accelerator.prepare(model, opt)
                train(ddp_model, opt)
                merged = model.merge_and_unload()
            """,
            options={"accelerate_config": _YAML_FSDP1},
            line=7,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        fsdp1_launch = a.launch_fsdp_version == 1
        for t in a.timelines:
            stale = _stale_names(a, t, fsdp1_launch)
            if not stale:
                continue
            for ev in t.events:
                if ev.kind not in _USES or ev.ref is None or ev.ref.path:
                    continue
                if ev.kind == "save" and a.keyword(ev.call, "state_dict") is not None:
                    continue
                for key, wrap_step, how in stale:
                    if ev.ref.key != key or ev.step.order <= wrap_step.order:
                        continue
                    if ev.kind == "generate" and how != "trainer.train()":
                        continue  # the name still reaches the wrapped model: FSDP108's finding
                    if a.exclusive(wrap_step, ev.step) or _rebound(a, t, key, wrap_step, ev.step):
                        continue
                    ctx.report(
                        ev.node,
                        f"{_LABEL[ev.kind]} through `{key.rsplit(':', 1)[-1]}`, the model's name from before {how} "
                        f"(line {ctx.line(wrap_step.item.node)}): FSDP1 shares these submodules and their parameters "
                        "are now this rank's flat shards, gathered only inside the wrapper's forward, so this runs "
                        "on shards ('weight' must be 2-D) or saves a shard. Use the wrapped object and gather: "
                        "FSDP.summon_full_params / FSDP.state_dict_type(FULL_STATE_DICT) on the wrapper, "
                        "trainer.save_model(), or accelerator.get_state_dict(wrapped).",
                    )
                    break


def _stale_names(a, t, fsdp1_launch):
    """[(key of the pre-wrap name, the wrapping step, description)]"""
    out = []
    for step in t.steps:
        call = step.call
        if call is None:
            continue
        if call.api == "FSDP1" or (fsdp1_launch and call.method == "prepare" and a._is_accelerator(call.receiver)):
            arg = call.arg(0, "module") if call.api == "FSDP1" else call.arg(0)
            src = dotted(arg) if arg is not None else None
            tgts = [dotted(x) for x in call.targets]
            if call.method == "prepare" and call.targets and hasattr(call.targets[0], "elements"):
                tgts = [dotted(e.value) for e in call.targets[0].elements[:1]]
            if not src or "." in src or not tgts or None in tgts or src in tgts:
                continue
            how = "FullyShardedDataParallel" if call.api == "FSDP1" else "accelerator.prepare"
            out.append((step.key(src), step, how))
        elif fsdp1_launch and call.method == "train" and a.is_trainer(call.receiver):
            for tc in a.calls("Trainer"):
                m = tc.kw("model")
                src = dotted(m) if m is not None else None
                if src and "." not in src:
                    out.append((step.key(src), step, "trainer.train()"))
    return out


def _rebound(a, t, key, first, then) -> bool:
    """The old name is assigned again between the wrap and the use."""
    name = key.rsplit(":", 1)[-1]
    for step in t.steps[first.order + 1: then.order]:
        call = step.call
        if call is not None and any(dotted(x) == name for x in call.targets) and step.key(name) == key:
            return True
    scope = getattr(then.item, "scope", None)
    if scope is not None:
        for seq, _ in scope.assigns.get(name, ()):
            if first.seq < seq < then.seq:
                return True
    return False
