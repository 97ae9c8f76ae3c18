import re

from fsdplint.analysis import UNKNOWN
from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._jobs import job_of, report_job
from fsdplint.rules._quantization import unknown_choice

YAML_FSDP = """\
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
num_processes: 4
"""


class EightBitWithFsdp(Rule):
    code = "FSDP203"
    name = "8bit-with-fsdp"
    severity = Severity.ERROR
    summary = "bitsandbytes 8-bit loading under FSDP (int8 params cannot be flattened)."
    sides = "S"
    doc = """
    ## What it does
    Finds `load_in_8bit=True` (in `BitsAndBytesConfig` or passed to `from_pretrained`) in a script that
    shards the model with FSDP (`FullyShardedDataParallel`, `fully_shard`, an accelerate FSDP config or
    `TrainingArguments(fsdp=...)`), and `load_in_8bit: true` / `quantization_bit: 8` in an axolotl or
    LLaMA-Factory config with FSDP (except where the tool refuses it or handles it: LLaMA-Factory >= 0.7.1,
    axolotl >= 0.15.0 under FSDP2).

    ## Why is this bad?
    bitsandbytes stores 8-bit weights as `Int8Params` with an int8 dtype and has no float storage option
    (unlike 4-bit's `bnb_4bit_quant_storage`). FSDP1 cannot put int8 tensors into a flat parameter next to
    the bf16/fp16 ones: `ValueError: Must flatten tensors with uniform dtype but got torch.float16 and
    torch.int8` (or `Cannot flatten integer dtype tensors`); FSDP2 turns them into plain DTensors and
    drops the quantization state.

    ## Example
    ```python
    bnb = BitsAndBytesConfig(load_in_8bit=True)
    model = AutoModelForCausalLM.from_pretrained(name, quantization_config=bnb)
    model = FSDP(model)
    ```

    ## Use instead
    ```python
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
    ```
    or train the 8-bit model with DDP.

    ## Fix safety
    No automatic fix: switching to 4-bit changes the model's precision; switching to DDP changes memory.

    ## Versions
    All bitsandbytes versions.

    ## References
    - bnb#1709; peft docs accelerate/fsdp.md (caveats)
    """
    references = ("bnb#1709",)

    VALID = [
        # The script refuses 8-bit under FSDP before it builds the config.
        """
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def run(cfg):
            if cfg.bits == "8bit" and cfg.use_fsdp:
                raise ValueError("8-bit weights cannot be sharded")
            bnb = BitsAndBytesConfig(load_in_8bit=True) if cfg.bits == "8bit" else None
            model = AutoModelForCausalLM.from_pretrained(cfg.name, quantization_config=bnb)
            if cfg.use_fsdp:
                model = FSDP(model)
        """,
        # 8-bit without FSDP (single GPU / DDP).
        """
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig
        model = AutoModelForCausalLM.from_pretrained(name, quantization_config=BitsAndBytesConfig(load_in_8bit=True))
        """,
        # 4-bit with a float storage under FSDP.
        """
        import torch
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained(name, quantization_config=bnb, dtype=torch.bfloat16)
        model = FSDP(model)
        """,
        # A test file: each test is a program of its own, and only another test uses FSDP.
        """
        from transformers import AutoModelForCausalLM
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        class TestQuantized:
            def test_8bit_generate(self):
                model = AutoModelForCausalLM.from_pretrained(name, load_in_8bit=True)
                model.generate(**inputs)

            def test_fsdp_wrap(self):
                FSDP(AutoModelForCausalLM.from_pretrained(name))
        """,
        # A helper's 8-bit branch that the script never takes: it asks for 4 bits.
        """
        import torch
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def quant_config(bits):
            if bits == 8:
                return BitsAndBytesConfig(load_in_8bit=True)
            elif bits == 4:
                return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
            return None

        def main():
            bnb = quant_config(4)
            model = AutoModelForCausalLM.from_pretrained("org/model", quantization_config=bnb, dtype=torch.bfloat16)
            model = FSDP(model, use_orig_params=True)
        """,
        # Explicitly off.
        Valid(
            """
            from transformers import BitsAndBytesConfig
            bnb = BitsAndBytesConfig(load_in_8bit=False, load_in_4bit=False)
            """,
            options={"accelerate_config": YAML_FSDP},
        ),
    ]
    INVALID = [
        # One option of a choice made from a value fsdplint cannot read (a config filled from the command
        # line): a warning that names the condition.
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig

            def main(train_config):
                if train_config.quantization == "4bit":
                    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
                elif train_config.quantization == "8bit":
                    bnb = BitsAndBytesConfig(load_in_8bit=True)
                model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb)
                model = FSDP(model)
            """,
            line=8,
            severity="warning",
        ),
        # The script asks the helper for its 8-bit branch.
        Invalid(
            """
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            def quant_config(bits):
                if bits == 8:
                    return BitsAndBytesConfig(load_in_8bit=True)
                return BitsAndBytesConfig(load_in_4bit=True)

            model = AutoModelForCausalLM.from_pretrained("org/model", quantization_config=quant_config(8))
            model = FSDP(model, use_orig_params=True)
            """,
            line=6,
        ),
        # The same test loads in 8-bit and wraps with FSDP.
        Invalid(
            """
            from transformers import AutoModelForCausalLM
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            def test_8bit_fsdp():
                model = AutoModelForCausalLM.from_pretrained(name, load_in_8bit=True)
                FSDP(model)

            def test_generate():
                AutoModelForCausalLM.from_pretrained(name).generate(**inputs)
            """,
            line=5,
        ),
        Invalid(
            """
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            bnb = BitsAndBytesConfig(load_in_8bit=True)
            model = AutoModelForCausalLM.from_pretrained(name, quantization_config=bnb)
            model = FSDP(model)
            """,
            line=3,
        ),
        Invalid(
            """
            import transformers as tf
            model = tf.AutoModelForCausalLM.from_pretrained(name, load_in_8bit=True)
            args = tf.TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap")
            """,
            line=2,
        ),
        Invalid(
            """
            from transformers import BitsAndBytesConfig as BnB
            quant = dict(load_in_8bit=True)
            bnb = BnB(**quant)
            """,
            line=3,
            options={"accelerate_config": YAML_FSDP},
        ),
        Invalid(
            """
            from transformers import BitsAndBytesConfig
            from torch.distributed.fsdp import fully_shard
            bnb = BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=6.0)
            fully_shard(model)
            """,
            line=3,
        ),
    ]

    def check(self, ctx) -> None:
        job = job_of(ctx)
        if job is not None:
            q = job.quant
            if q is not None and q.bits == 8 and job.fsdp_version in (1, 2):
                report_job(ctx, q.setting,
                           f"{job.name} loads this model in 8-bit under FSDP{job.fsdp_version} ({job.fsdp_version_why}): "
                           "bitsandbytes' int8 weights cannot be flattened or sharded with the float parameters "
                           "(ValueError: Cannot flatten integer dtype tensors)", job.gate(self.code),
                           job.remedy.get(self.code))
            return
        a = ctx.analysis
        for call in a.calls("BitsAndBytesConfig", "load_model"):
            if not a.fsdp_at(call):
                continue
            expr = a.keyword(call, "load_in_8bit")
            if expr is None or expr is UNKNOWN or a.value(expr, call.scope) is not True:
                continue
            if _never_taken(a, call):
                continue  # a branch of a helper that no call of it in this script takes
            if _rejected(ctx, a, call):
                continue  # the script itself refuses 8-bit under FSDP before anything loads
            choice = unknown_choice(a, call)
            ctx.report(
                call.kwarg("load_in_8bit") or call.node,
                "The model is loaded in 8-bit under FSDP" + (
                    f" when `{a.code(choice.node.test)}` (line {ctx.line(choice.node)}), a value fsdplint cannot "
                    "read here (a config or command-line value)" if choice is not None else "") +
                ": bitsandbytes' int8 weights cannot be flattened or sharded "
                "with the float parameters (ValueError: Must flatten tensors with uniform dtype ... torch.int8). Use "
                "4-bit with bnb_4bit_quant_storage equal to the model dtype, or DDP.",
                # One option of a choice the job makes at run time: a warning, not an error on a guess.
                severity=Severity.WARNING if choice is not None else None,
            )


_RAISING_IF = re.compile(r"^[ \t]*(?:el)?if\b(.*):[ \t]*(?:#.*)?\n(?:[ \t]*(?:#.*)?\n)*[ \t]*raise\b", re.M)
_EIGHT_BIT = re.compile(r"8[_ -]?bit|int8", re.I)


def _rejected(ctx, a, call) -> bool:
    """An `if <8-bit> and <FSDP>: raise ...` in this file or in the module the 8-bit config comes from
    (`if train_config.quantization == "8bit" and train_config.enable_fsdp: raise ValueError(...)`): the
    combination never runs."""
    texts = [ctx.source]
    origin = next((s.origin for t in a.timelines for s in t.steps if s.item is call and s.origin is not None), None)
    if origin is not None:
        texts.append(origin.text)
    for text in texts:
        for m in _RAISING_IF.finditer(text):
            test = m.group(1)
            if _EIGHT_BIT.search(test) and "fsdp" in test.lower():
                return True
    return False


def _never_taken(a, call) -> bool:
    """The call sits in a helper's `if` on one of its parameters (`if bits == 8:`), and every call of the
    helper in this script passes a value that takes the other branch (`quant_config(4)`)."""
    import libcst as cst

    tests = [(g.node.test, g.branch == "body") for g in call.guards
             if g.branch is not None and not g.loop_depth and isinstance(getattr(g.node, "test", None), cst.BaseExpression)]
    scope = call.scope
    if not tests or scope.node is None:
        return False
    steps = [s for t in a.timelines for s in t.steps if s.item is call]
    if not steps:
        return False
    params = scope.params[1:] if scope.klass and scope.params[:1] == ["self"] else scope.params
    for step in steps:
        sites = a.site_calls(step)
        if len(sites) < 2:
            return False  # the helper's own timeline: nobody in this file calls it
        site = sites[1]
        env = {}
        for i, p in enumerate(params):
            arg = site.arg(i, p)
            if arg is not None:
                env[p] = a.value(arg, site.scope)
        if not any(_contradicts(test, positive, env) for test, positive in tests):
            return False
    return True


def _contradicts(test, positive: bool, env: dict) -> bool:
    """`test` (as it must be for the branch: true when `positive`) is false for the parameter values in `env`."""
    import libcst as cst

    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _contradicts(test.expression, not positive, env)
    if isinstance(test, cst.Name) and isinstance(env.get(test.value), bool):
        return env[test.value] is not positive
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(test.left, cst.Name):
        value = env.get(test.left.value)
        if value is None or value is UNKNOWN or isinstance(value, (dict, list)):
            return False
        comp = test.comparisons[0]
        try:
            literal = _literal(comp.comparator)
        except ValueError:
            return False
        if isinstance(comp.operator, cst.Equal):
            holds = value == literal
        elif isinstance(comp.operator, cst.NotEqual):
            holds = value != literal
        elif isinstance(comp.operator, cst.In) and isinstance(literal, tuple):
            holds = value in literal
        else:
            return False
        return holds is not positive
    return False


def _literal(expr):
    import ast

    import libcst as cst

    code = cst.Module([]).code_for_node(expr)
    value = ast.literal_eval(code)
    if isinstance(value, list):
        value = tuple(value)
    return value
