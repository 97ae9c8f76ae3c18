"""The shared script analysis that rules query: events, their order, and which model they touch."""

from __future__ import annotations

import textwrap

import libcst as cst

from fsdplint.analysis import UNKNOWN, QName, analyze


def analysis(src: str):
    return analyze(cst.parse_module(textwrap.dedent(src).lstrip("\n")))


def only_timeline(src: str):
    a = analysis(src)
    assert len(a.timelines) == 1, [t.scope.name for t in a.timelines]
    return a, a.timelines[0]


def kinds(t, *wanted):
    return [e.kind for e in t.events if not wanted or e.kind in wanted]


# -- entities: one model through every name it goes by -------------------------------------------


def test_wrapping_and_lora_keep_one_model_identity():
    _, t = only_timeline(
        """
        from peft import get_peft_model
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from transformers import AutoModelForCausalLM
        base = AutoModelForCausalLM.from_pretrained("m")
        peft_model = get_peft_model(base, cfg)
        wrapped = FSDP(peft_model, use_orig_params=True)
        wrapped.module.save_pretrained("out")
        """
    )
    assert kinds(t) == ["load", "lora", "wrap1", "save"]
    lora, wrap, save = t.events[1:]
    assert lora.entity == wrap.entity == save.entity is not None


def test_unrelated_models_are_different_entities():
    _, t = only_timeline(
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        policy_model = FSDP(policy_model)
        ref_model = FSDP(ref_model)
        """
    )
    a, b = t.of("wrap1")
    assert a.entity != b.entity


def test_aliased_module_import_resolves_the_api():
    _, t = only_timeline(
        """
        import torch.distributed.fsdp as f
        from peft import get_peft_model as add_lora
        model = add_lora(model, cfg)
        f.fully_shard(model)
        """
    )
    assert kinds(t) == ["lora", "shard2"]
    assert t.events[0].entity == t.events[1].entity


def test_tuple_unpacking_of_prepare_keeps_identities():
    a, t = only_timeline(
        """
        from accelerate import Accelerator
        accelerator = Accelerator()
        model, optimizer = accelerator.prepare(model, optimizer)
        model.generate(x)
        """
    )
    prep = t.of("prepare")
    assert len(prep) == 2 and prep[0].step is prep[1].step
    assert t.of("generate")[0].entity == prep[0].entity != prep[1].entity


def test_attribute_holder_is_one_model_across_methods():
    a = analysis(
        """
        from peft import get_peft_model
        from torch.distributed.fsdp import FullyShardedDataParallel

        class Runner:
            def build(self):
                self.model = get_peft_model(self.model, cfg)
                self.model = FullyShardedDataParallel(self.model)
        """
    )
    (t,) = [t for t in a.timelines if t.events]
    lora, wrap = t.events
    assert (lora.kind, wrap.kind) == ("lora", "wrap1") and lora.entity == wrap.entity


# -- helpers: inlined at their call site, in execution order --------------------------------------


def test_helper_is_inlined_and_not_a_timeline_of_its_own():
    a = analysis(
        """
        from torch.distributed.fsdp import fully_shard

        def shard(m):
            for layer in m.layers:
                fully_shard(layer)
            fully_shard(m)
            return m

        def main():
            model = load()
            model = shard(model)
            model.generate(x)
        """
    )
    assert [t.scope.name for t in a.timelines] == ["main"]
    t = a.timelines[0]
    layer, root, gen = t.events
    assert (layer.kind, layer.ref.child) == ("shard2", True)
    assert (root.kind, root.ref.child) == ("shard2", False)
    assert layer.entity == root.entity == gen.entity
    assert t.wrap_state(gen.entity, gen.seq) == "fsdp2"


def test_helper_defined_below_its_caller_runs_at_the_call():
    _, t = only_timeline(
        """
        from peft import get_peft_model
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def main():
            model = load()
            model = add_lora(model)
            model = FSDP(model)

        def add_lora(m):
            return get_peft_model(m, cfg)
        """
    )
    lora, wrap = t.events
    assert (lora.kind, wrap.kind) == ("lora", "wrap1")
    assert lora.seq < wrap.seq
    assert t.before(wrap, ("lora",)) == [lora] and t.before(lora, ("wrap1",)) == []


def test_recursive_helpers_do_not_loop_forever():
    a = analysis(
        """
        def f(m):
            return g(m)

        def g(m):
            return f(m)

        f(model)
        """
    )
    assert [t.scope.name for t in a.timelines] == ["<module>"]


# -- loops: a loop variable over part of the model is a child of the model ------------------------


def test_loop_over_layers_is_a_child_of_the_model():
    _, t = only_timeline(
        """
        from torch.distributed.fsdp import fully_shard
        layers = model.model.layers
        for i, block in enumerate(layers):
            fully_shard(block)
        for name, m in model.named_modules():
            fully_shard(m)
        for _, blk in model.blocks.items():
            fully_shard(blk)
        fully_shard([model.embed, model.lm_head])
        fully_shard(model)
        """
    )
    events = t.of("shard2")
    assert [e.ref.child for e in events] == [True, True, True, True, False]
    assert len({e.entity for e in events}) == 1


def test_requires_grad_false_in_a_loop_is_a_freeze_of_the_model():
    _, t = only_timeline(
        """
        from torch.optim import AdamW
        for name, p in model.named_parameters():
            if "lora_" not in name:
                p.requires_grad = False
        opt = AdamW(model.parameters())
        """
    )
    freeze, opt = t.events
    assert (freeze.kind, freeze.data["partial"]) == ("freeze", True)
    assert (opt.kind, opt.data["filtered"]) == ("optimizer", False)
    assert freeze.entity == opt.entity


def test_optimizer_over_trainable_params_counts_as_filtered():
    _, t = only_timeline(
        """
        import torch
        trainable = [p for p in model.parameters() if p.requires_grad]
        a = torch.optim.AdamW(trainable)
        b = torch.optim.AdamW(filter(lambda p: p.requires_grad, model.parameters()))
        c = torch.optim.AdamW(model.parameters())
        sched = torch.optim.lr_scheduler.StepLR(c, 1)
        """
    )
    assert [e.data["filtered"] for e in t.of("optimizer")] == [True, True, False]
    assert len({e.entity for e in t.of("optimizer")}) == 1


# -- guards ----------------------------------------------------------------------------------------


def test_rank_and_version_guards():
    a, t = only_timeline(
        """
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        if dist.get_rank() == 0:
            model.save_pretrained("a")
        if local_rank != 0:
            pass
        else:
            model.save_pretrained("b")
        if is_torch_version(">=", "2.7"):
            fully_shard(model, ignored_params=frozen)
        model.save_pretrained("c")
        """
    )
    a_, b_, c_ = t.of("save")
    assert a.rank_guard(a_.step) is not None and a.rank_guard(b_.step) is not None
    assert a.rank_guard(c_.step) is None
    assert [g.kind for g in b_.call.guards] == ["rank0"]
    (shard,) = t.of("shard2")
    assert shard.call.version_guarded and not shard.call.rank_guarded


def test_guard_at_a_helper_call_site_reaches_the_helper_body():
    a, t = only_timeline(
        """
        def save(m):
            m.save_pretrained("out")

        def main():
            if rank == 0:
                save(model)
        """
    )
    (ev,) = t.of("save")
    assert ev.call.guards == ()  # the body itself is unguarded ...
    assert a.rank_guard(ev.step) is not None  # ... but it only runs on rank 0


# -- values and keyword arguments ----------------------------------------------------------------


def test_value_follows_single_bindings_and_marks_unknowns():
    a = analysis(
        """
        import torch
        dtype = torch.bfloat16
        r = 16
        flags = {"use_orig_params": True, "n": -1}
        twice = 1
        twice = 2
        """
    )

    def val(src):
        return a.value(cst.parse_expression(src), a.c.module_scope)

    assert val("dtype") == QName("torch.bfloat16")
    assert val("r") == 16 and val("flags") == {"use_orig_params": True, "n": -1}
    assert val("twice") is UNKNOWN and val("f(x)") is UNKNOWN
    assert not UNKNOWN


def test_keywords_merge_star_dicts_and_give_up_on_unknown_ones():
    a = analysis(
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        kw = {"use_orig_params": True}
        kw["sync_module_states"] = True
        FSDP(model, device_id=0, **kw)
        FSDP(model, **dict(use_orig_params=False))
        FSDP(model, **get_kwargs())
        other = {}
        other.update(opts)
        FSDP(model, **other)
        """
    )
    first, second, third, fourth = a.calls("FSDP1")
    assert set(a.keywords(first)) == {"device_id", "use_orig_params", "sync_module_states"}
    assert a.value(a.keywords(second)["use_orig_params"]) is False
    assert a.keywords(third) is None and a.keywords(fourth) is None


def test_call_for_follows_a_name_to_the_call_that_built_it():
    a = analysis(
        """
        from peft import LoraConfig, get_peft_model
        cfg = LoraConfig(r=8, target_modules=["q_proj"])
        model = get_peft_model(model, cfg)
        """
    )
    (lora_call,) = a.calls("get_peft_model")
    built = a.call_for(lora_call.arg(1, "peft_config"), lora_call.scope, "LoraConfig")
    assert built is not None and a.value(built.kw("r")) == 8
    assert a.call_for(lora_call.arg(1), lora_call.scope, "BitsAndBytesConfig") is None


# -- escapes: the model handed to code the analysis cannot see ------------------------------------


def test_model_passed_to_unknown_code_escapes():
    _, t = only_timeline(
        """
        from torch.distributed.fsdp import fully_shard
        from mylib import shard_blocks
        print(model)
        model.to("cuda")
        fully_shard(model)
        shard_blocks(model)
        fully_shard(model)
        """
    )
    first, second = t.of("shard2")
    assert not t.escapes(first.entity, first)
    assert t.escapes(second.entity, second)


def test_uses_flags():
    a = analysis(
        """
        from peft import LoraConfig, get_peft_model
        from torch.distributed._composable.fsdp import fully_shard
        model = get_peft_model(model, LoraConfig(r=8))
        fully_shard(model)
        """
    )
    assert a.uses_fsdp2 and not a.uses_fsdp1 and a.uses_fsdp and a.uses_peft


# -- branches that exclude each other -------------------------------------------------------------


def _wrap_and_move(src: str):
    _, t = only_timeline(src)
    (wrap,), (move,) = t.of("wrap1"), t.of("move")
    return t, wrap, move


def test_if_else_branches_exclude_each_other():
    t, wrap, move = _wrap_and_move(
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        if cfg.enable_fsdp:
            model = FSDP(model)
        elif not cfg.quantization:
            model.to("cuda")
        """
    )
    assert t.exclusive(wrap, move)
    assert t.before(move, ("wrap1",)) == []


def test_contradicting_tests_of_separate_ifs_exclude_each_other():
    t, wrap, move = _wrap_and_move(
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        if args.mode in ("fsdp", "hsdp") and args.train:
            model = FSDP(model)
        if args.mode == "single" or args.debug:
            pass
        if args.mode == "single":
            model.to("cuda")
        """
    )
    assert t.exclusive(wrap, move)


def test_sequential_or_overlapping_branches_both_run():
    for src in (
        # One after the other: both run.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        if use_fsdp:
            model = FSDP(model)
        model.to("cuda")
        """,
        # Different conditions that can both hold.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        if use_fsdp:
            model = FSDP(model)
        if not offload:
            model.to("cuda")
        """,
        # `mode in (a, b)` and `mode == "b"` can both hold.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        if mode in ("fsdp", "hsdp"):
            model = FSDP(model)
        if mode == "hsdp":
            model.to("cuda")
        """,
    ):
        t, wrap, move = _wrap_and_move(src)
        assert not t.exclusive(wrap, move)
        assert t.before(move, ("wrap1",)) == [wrap]


def test_branches_of_an_if_in_a_loop_can_both_run():
    t, wrap, move = _wrap_and_move(
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        for stage in stages:
            if stage == "wrap":
                model = FSDP(model)
            else:
                model.to("cuda")
        """
    )
    assert not t.exclusive(wrap, move)


def test_branches_around_helper_calls_exclude_the_inlined_calls():
    a = analysis(
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def wrap(model):
            return FSDP(model)

        def place(model):
            model.to("cuda")

        def main(model, use_fsdp):
            if use_fsdp:
                model = wrap(model)
            else:
                place(model)

        main(model, args.fsdp)
        """
    )
    (t,) = [t for t in a.timelines if t.of("wrap1")]
    (wrap,), (move,) = t.of("wrap1"), t.of("move")
    assert t.exclusive(wrap, move)


def test_constant_flag_passed_to_a_helper_rules_out_its_other_branch():
    src = """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def build(model, cfg, shard=True):
            if cfg.distributed and shard:
                model = FSDP(model)
            elif not shard:
                model.to("cuda")
            return model

        a = build(model_a, cfg, shard=False)
        b = build(model_b, cfg, True)
        c = build(model_c, cfg, shard=flag)
        """
    t = analysis(src).timelines[0]
    wrapped = {e.entity.split(":")[-1] for e in t.of("wrap1")}
    moved = {e.entity.split(":")[-1] for e in t.of("move")}
    assert wrapped == {"model_b", "model_c"} and moved == {"model_a", "model_c"}


def test_a_function_defined_inside_a_helper_runs_where_the_helper_calls_it():
    src = """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def setup(model):
            def wrap(m):
                return FSDP(m)
            return wrap(model)

        def wrap(m):
            m.to("cuda")

        model = setup(model)
        """
    (t,) = [t for t in analysis(src).timelines if t.events]
    # the nested `wrap` (not the module-level one of the same name) is what `setup` calls
    assert [e.kind for e in t.events] == ["wrap1"]


# -- guards, hooks and conditional names -------------------------------------------------------


def test_conditional_expression_naming_one_model_either_way_is_an_alias():
    _, t = only_timeline(
        """
        from accelerate import Accelerator
        accelerator = Accelerator()
        model, opt = accelerator.prepare(model, opt)
        plain = accelerator.unwrap_model(model) if accelerator is not None else model
        other = model if use_teacher else teacher
        plain.save_pretrained("out")
        other.save_pretrained("teacher")
        """
    )
    prepared = next(e for e in t.events if e.kind == "prepare" and e.entity and "model" in e.entity)
    saves = [e for e in t.events if e.kind == "save"]
    assert [e.entity == prepared.entity for e in saves] == [True, False]


def test_trainer_callback_events_get_the_trainers_model():
    a = analysis(
        """
        from transformers import TrainerCallback

        class Export(TrainerCallback):
            def on_save(self, args, state, control, **kwargs):
                kwargs["model"].save_pretrained(args.output_dir)

            def on_train_end(self, args, state, control, model=None, **kw):
                model.save_pretrained(args.output_dir)

        class NotACallback:
            def on_save(self, args, state, control, **kwargs):
                kwargs["model"].save_pretrained(args.output_dir)
        """
    )
    saves = [(t.scope.klass, e.ref.key.rsplit(":", 1)[-1]) for t in a.timelines for e in t.events if e.kind == "save"]
    assert ("Export", "trainer.model") in saves
    assert saves.count(("Export", "trainer.model")) == 2
    assert all(key != "trainer.model" for klass, key in saves if klass == "NotACallback")


def test_branches_that_ask_whether_fsdp_is_on():
    a = analysis(
        """
        from accelerate.utils import DistributedType

        def save(accelerator, trainer, model):
            if accelerator.distributed_type == DistributedType.FSDP:
                model.save_pretrained("a")
            else:
                model.save_pretrained("b")
            if not trainer.is_fsdp_enabled:
                model.save_pretrained("c")
            if step % 10 == 0:
                model.save_pretrained("d")
        """
    )
    (t,) = a.timelines
    assert [a.fsdp_branch(e.step) for e in t.events if e.kind == "save"] == [True, False, False, None]
