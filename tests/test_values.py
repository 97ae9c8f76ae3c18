"""The set-valued API beside `value()`: reassignments in branches, conditional expressions, parameter
defaults and parsed arguments."""

from __future__ import annotations

import textwrap

import libcst as cst

from fsdplint.analysis import UNKNOWN, ScriptAnalysis
from fsdplint.launch.arguments import bind, parse_definitions
from fsdplint.launch.shell import parse_launches


def _analysis(src: str, cmd: str | None = None) -> ScriptAnalysis:
    src = textwrap.dedent(src)
    defs = parse_definitions(src)
    env = bind(defs, parse_launches(cmd, "run.sh")[0] if cmd else None) if defs else None
    return ScriptAnalysis(cst.parse_module(src), env=env)


def _kw(a: ScriptAnalysis, api: str, name: str):
    (call,) = a.calls(api)
    return call, a.keyword(call, name)


SRC = """
import argparse
from transformers import BitsAndBytesConfig

p = argparse.ArgumentParser()
p.add_argument("--quantize", action="store_true")
p.add_argument("--bits", type=int, default=16)
args = p.parse_args()
storage = None
if args.quantize:
    storage = "bfloat16"
cfg = BitsAndBytesConfig(load_in_4bit=True if args.bits == 4 else None, bnb_4bit_quant_storage=storage)
"""


def test_values_follow_branches_and_conditional_expressions():
    a = _analysis(SRC)
    call, kw = _kw(a, "BitsAndBytesConfig", "load_in_4bit")
    assert a.values(kw, call.scope) == frozenset({None}) and a.value(kw, call.scope) is None
    storage = a.keyword(call, "bnb_4bit_quant_storage")
    assert a.value(storage, call.scope) is None  # the `if args.quantize:` branch cannot run

    a = _analysis(SRC, "python t.py --quantize --bits 4\n")
    call, kw = _kw(a, "BitsAndBytesConfig", "load_in_4bit")
    assert a.value(kw, call.scope) is True
    assert a.value(a.keyword(call, "bnb_4bit_quant_storage"), call.scope) == "bfloat16"


def test_without_arguments_values_are_sets_and_value_stays_unknown():
    src = """
    from transformers import BitsAndBytesConfig
    storage = None
    if use_bf16:
        storage = "bfloat16"
    cfg = BitsAndBytesConfig(bnb_4bit_quant_storage=storage)
    """
    a = _analysis(src)
    call, kw = _kw(a, "BitsAndBytesConfig", "bnb_4bit_quant_storage")
    assert a.values(kw, call.scope) == frozenset({None, "bfloat16"})
    assert a.value(kw, call.scope) is UNKNOWN


def test_parameter_defaults_and_call_sites():
    src = """
    from transformers import BitsAndBytesConfig

    def build(four_bit=False):
        return BitsAndBytesConfig(load_in_4bit=four_bit)

    build()
    build(four_bit=True)
    """
    a = _analysis(src)
    call, kw = _kw(a, "BitsAndBytesConfig", "load_in_4bit")
    assert a.values(kw, call.scope) == frozenset({False, True})


def test_truth_of_argument_tests():
    a = _analysis(SRC, 'python t.py --bits 4 "$@"\n')
    test = cst.parse_expression("args.bits == 4 and not args.quantize")
    # `--quantize` may come through "$@": unknown, so the conjunction may be true or unknown
    assert a.truth(test) == frozenset({True, UNKNOWN})
    assert a.truth(cst.parse_expression("args.bits > 8")) == frozenset({False})


def test_dataclass_defaults_and_keywords():
    src = """
    from dataclasses import dataclass, field
    from transformers import BitsAndBytesConfig

    @dataclass
    class Config:
        load_in_4bit: bool = True
        storage: str = field(default="bfloat16")

    cfg = Config(storage="uint8")
    bnb = BitsAndBytesConfig(load_in_4bit=cfg.load_in_4bit, bnb_4bit_quant_storage=cfg.storage)
    """
    a = _analysis(src)
    call, kw = _kw(a, "BitsAndBytesConfig", "load_in_4bit")
    assert a.value(kw, call.scope) is True
    assert a.value(a.keyword(call, "bnb_4bit_quant_storage"), call.scope) == "uint8"


def _code(a: ScriptAnalysis, conds) -> list:
    return [(a.code(test), holds) for test, holds in conds]


def test_value_conditions_name_the_path_to_a_value():
    src = """
    from transformers import AutoModelForCausalLM

    def load(opts):
        placement = None
        if opts.four_bit:
            placement = "auto"
        return AutoModelForCausalLM.from_pretrained(opts.name, device_map=placement)

    def load_dense(opts):
        placement = "auto"
        if opts.spread == "rows":
            placement = {"": 0}
        return AutoModelForCausalLM.from_pretrained(opts.name, device_map=placement)

    def load_inline(opts):
        return AutoModelForCausalLM.from_pretrained(opts.name, device_map="auto" if opts.big else None)
    """
    a = _analysis(src)
    wanted = lambda v: v == "auto"  # noqa: E731
    calls = {c.scope.name: c for c in a.calls("load_model")}
    dm = {name: c.kw("device_map") for name, c in calls.items()}
    assert _code(a, a.value_conditions(dm["load"], calls["load"].scope, wanted)) == [("opts.four_bit", True)]
    # "auto" first, replaced on one path: it holds when that path is not taken.
    assert _code(a, a.value_conditions(dm["load_dense"], calls["load_dense"].scope, wanted)) == [
        ('opts.spread == "rows"', False)]
    assert _code(a, a.value_conditions(dm["load_inline"], calls["load_inline"].scope, wanted)) == [("opts.big", True)]
    # No path gives the value.
    assert a.value_conditions(dm["load"], calls["load"].scope, lambda v: v == "balanced") is None


def test_value_conditions_in_a_loop_are_not_told():
    src = """
    from transformers import AutoModelForCausalLM
    placement = None
    for name in names:
        if name.endswith("70b"):
            placement = "auto"
    model = AutoModelForCausalLM.from_pretrained(name, device_map=placement)
    """
    a = _analysis(src)
    (call,) = a.calls("load_model")
    assert a.value_conditions(call.kw("device_map"), call.scope, lambda v: v == "auto") is None


def test_training_arguments_from_a_dict_filled_by_keys():
    from fsdplint.launch.settings import from_script

    src = """
    from transformers import TrainingArguments
    def make(sharded):
        extra = {"report_to": "none"}
        if sharded:
            extra["fsdp"] = "full_shard auto_wrap"
            extra["fsdp_config"] = {"use_orig_params": True}
        return TrainingArguments(output_dir="out", **extra)
    """
    facts = from_script(_analysis(src))
    assert facts.fsdp_version == 1
    assert facts.value("sharding") == "full_shard auto_wrap"
    assert facts.value("use_orig_params") is True
    # A dict the file does not spell out stays unknown: no FSDP claimed.
    facts = from_script(_analysis("""
    from transformers import TrainingArguments
    args = TrainingArguments(output_dir="out", **load_overrides())
    """))
    assert facts.fsdp_version is None


def test_keyword_through_dict_update():
    src = """
    from transformers import TrainingArguments
    extra = {"bf16": True}
    extra.update(fsdp="full_shard")
    more = {}
    more.update({"fsdp_config": {"version": 2}})
    hidden = {}
    hidden.update(load_overrides())
    a1 = TrainingArguments(output_dir="a", **extra)
    a2 = TrainingArguments(output_dir="b", **more)
    a3 = TrainingArguments(output_dir="c", **hidden)
    """
    a = _analysis(src)
    c1, c2, c3 = a.calls("TrainingArguments")
    assert a.value(a.keyword(c1, "fsdp"), c1.scope) == "full_shard"
    assert a.value(a.keyword(c2, "fsdp_config"), c2.scope) == {"version": 2}
    assert a.keyword(c2, "fsdp") is None
    assert a.keyword(c3, "fsdp") is UNKNOWN
