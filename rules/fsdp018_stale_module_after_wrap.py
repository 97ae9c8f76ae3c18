import libcst as cst

from fsdplint.analysis.builder import HOLDERS
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
    `model.save_pretrained(...)` or `model.generate(...)` (FSDP1 launch). The Trainer may be a subclass
    (`class MyTrainer(Trainer)`, here or in another module) given the model positionally, and the name an
    attribute (`self.model` of a class whose `fit()` trains it and whose `sample()` generates). Also the
    pre-wrap name handed to a class of the project that keeps it (`self.lm = lm` in `__init__`) and calls
    it or its `generate()` in a method — an evaluation adaptor built after training. `generate()` after a
    direct wrap is FSDP108's finding.

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
    - pytorch#111958 (lm-eval adaptor given the pre-wrap model after `trainer.train()`); pytorch#100069
      ("'weight' must be 2-D"); transformers#32285 (`self.model.generate` after a Trainer `fsdp="full_shard"`)
    - transformers src trainer.py ("self.model is the Transformers Model except when we are using FSDP")
    """
    references = ("pytorch#111958", "pytorch#100069", "transformers#32285")

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
        # The evaluation object gets the trainer's wrapped model, not the pre-wrap name.
        Valid(
            """
            from transformers import Trainer

            class Scorer:
                def __init__(self, lm):
                    self.lm = lm

                def score(self, ids):
                    return self.lm(ids).logits

            trainer = Trainer(model=model, args=args, train_dataset=ds)
            trainer.train()
            scorer = Scorer(trainer.model_wrapped)
            """,
            options={"accelerate_config": _YAML_FSDP1},
        ),
        # A class that keeps the pre-wrap model but only reads its config calls nothing on the shards.
        Valid(
            """
            from transformers import Trainer

            class Card:
                def __init__(self, lm):
                    self.lm = lm

                def text(self):
                    return str(self.lm.config)

            trainer = Trainer(model=model, args=args, train_dataset=ds)
            trainer.train()
            card = Card(model)
            """,
            options={"accelerate_config": _YAML_FSDP1},
        ),
        # transformers >= 5.10: TrainingArguments(fsdp=...) means FSDP2, which shards the model in place.
        Valid(
            """
            from transformers import Trainer, TrainingArguments

            class Job:
                def __init__(self, model):
                    self.model = model

                def fit(self, data):
                    trainer = Trainer(self.model, TrainingArguments("out", fsdp="full_shard"), train_dataset=data)
                    trainer.train()

                def sample(self, ids):
                    return self.model.generate(ids, max_new_tokens=8)
            """,
            target={"transformers": "5.24.0"},
        ),
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
        # A class holds the model; a Trainer subclass trains it (model passed positionally) under
        # TrainingArguments(fsdp=...), which means FSDP1 before transformers 5.10; another method samples.
        Invalid(
            """
            from transformers import Trainer, TrainingArguments

            class KeepColumnsTrainer(Trainer):
                pass

            class Job:
                def __init__(self, model):
                    self.model = model

                def fit(self, data):
                    args = TrainingArguments("out", fsdp="full_shard", save_strategy="no")
                    trainer = KeepColumnsTrainer(self.model, args, train_dataset=data)
                    trainer.train()

                def sample(self, ids):
                    return self.model.generate(ids, max_new_tokens=8)
            """,
            target={"transformers": "4.46.0"},
            line=16,
        ),
        # The pre-wrap model handed to an evaluation class that runs its forward.
        Invalid(
            """
            from transformers import Trainer

            class Scorer:
                def __init__(self, lm):
                    self.lm = lm

                def score(self, ids):
                    return self.lm(ids).logits

            trainer = Trainer(model=model, args=args, train_dataset=ds)
            trainer.train()
            scorer = Scorer(model)
            """,
            options={"accelerate_config": _YAML_FSDP1},
            line=12,
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
            self._check_handed_on(ctx, a, t, stale)

    def _check_handed_on(self, ctx, a, t, stale) -> None:
        """The pre-wrap name passed to a class of the project that keeps it (`self.model = model`) and calls it
        or its generate() in a method: an evaluation adaptor built after training runs on the shards."""
        for key, wrap_step, how in stale:
            name = key.rsplit(":", 1)[-1]
            for step in t.steps[wrap_step.order + 1:]:
                call = step.call
                if call is None or _rebound(a, t, key, wrap_step, step):
                    continue
                found = a.project_class(call)
                if found is None:
                    continue
                for i, arg in enumerate(call.node.args):
                    if arg.star or dotted(arg.value) != name or step.key(name) != key:
                        continue
                    use = _kept_and_called(found[0], found[1], i, arg.keyword.value if arg.keyword else None)
                    if use is None:
                        continue
                    method, what = use
                    ctx.report(
                        call.node,
                        f"`{name}`, the model's name from before {how} (line {ctx.line(wrap_step.item.node)}), is handed "
                        f"to {found[1]}, whose {method}() calls {what} on it: FSDP1 shares these submodules and their "
                        "parameters are now this rank's flat shards, gathered only inside the wrapper's forward, so "
                        "that call runs on shards ('weight' must be 2-D). Hand it the wrapped model (trainer.model_wrapped "
                        "/ the FSDP object, on every rank, under FSDP.summon_full_params for generate), or evaluate a "
                        "FULL_STATE_DICT checkpoint in a process without FSDP.",
                    )
                    break


def _kept_and_called(c, klass: str, index: int, keyword) -> "tuple[str, str] | None":
    """(method, what) when `klass.__init__` stores its parameter (by position `index` or `keyword`) as `self.X` and
    a method of the class calls `self.X(...)` or `self.X.generate(...)`."""
    init = c.methods.get((klass, "__init__"))
    if init is None:
        return None
    params = init.params[1:] if init.params[:1] == ["self"] else init.params
    param = keyword if keyword is not None else (params[index] if index < len(params) else None)
    if param is None or param not in params:
        return None
    attrs = {item.target for item in init.attr_sets
             if item.key is None and item.target.startswith("self.") and item.target.count(".") == 1
             and isinstance(item.value, cst.Name) and item.value.value == param}
    for (k, meth), scope in c.methods.items():
        if k != klass or meth == "__init__":
            continue
        for call in scope.calls:
            if call.func in attrs:
                return meth, f"`{call.func}(...)` (its forward)"
            if call.method == "generate" and call.receiver is not None and dotted(call.receiver) in attrs:
                return meth, f"`{dotted(call.receiver)}.generate(...)`"
    return None


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
            for src in _trainer_models(a, call):
                out.append((a._target_key(step, src), step, "trainer.train()"))
    return out


def _trainer_models(a, train_call) -> list[str]:
    """The names of the models a `trainer.train()` trains: the `model` argument (keyword, or first positional as
    in `Trainer(model, args, ...)`) of the constructor bound to the receiver, when that constructor is a Trainer
    (transformers/trl, or a class named `...Trainer`: a subclass); else of every Trainer call in the file.
    A plain name or an attribute of a holder (`self.model`)."""
    d = dotted(train_call.receiver)
    bound = a.binding(d, train_call.scope) if d else None
    ctor = a.call_at(bound) if isinstance(bound, cst.Call) else None
    if ctor is not None and (ctor.api == "Trainer" or (ctor.func or "").rsplit(".", 1)[-1].endswith("Trainer")):
        ctors = [ctor]
    else:
        ctors = a.calls("Trainer")
    out = []
    for tc in ctors:
        m = tc.kw("model") if tc.kw("model") is not None else (tc.arg(0) if tc.node.args and not tc.node.args[0].keyword else None)
        src = dotted(m) if m is not None else None
        if src and ("." not in src or (src.count(".") == 1 and src.split(".")[0] in HOLDERS)):
            out.append(src)
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
