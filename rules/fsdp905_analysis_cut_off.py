from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule

# A chain of helpers deeper than the analysis follows (`_MAX_DEPTH` in fsdplint/analysis/builder.py).
_DEEP_CHAIN = "\n".join(
    ["from torch.distributed.fsdp import FullyShardedDataParallel as FSDP",
     "from transformers import AutoModelForCausalLM", "", "",
     "def load12():", '    return AutoModelForCausalLM.from_pretrained("m")', ""]
    + [f"def load{i}():\n    return load{i + 1}()\n" for i in range(11, 0, -1)]
    + ["model = FSDP(load1())", ""])



def _chain(depth: int, last: str, wrap: str = "model = FSDP(load1())") -> str:
    """`load1()` -> `load2()` -> ... -> `load<depth>()`, whose body is `last`."""
    lines = ["from torch.distributed.fsdp import FullyShardedDataParallel as FSDP",
             "from transformers import AutoModelForCausalLM", "", "", f"def load{depth}():", f"    {last}", ""]
    lines += [f"def load{i}():\n    return load{i + 1}()\n" for i in range(depth - 1, 0, -1)]
    return "\n".join(lines + [wrap, ""])


# Helpers four calls deep that each run a small step many times: the deep-helper budget runs out.
_BUDGET = "\n".join(
    ["from torch.distributed.fsdp import FullyShardedDataParallel as FSDP",
     "from transformers import AutoModelForCausalLM", "", "",
     "def step(model):", "    model.tie_weights()", "    return model", "", "",
     "def load5():", '    model = AutoModelForCausalLM.from_pretrained("m")']
    + ["    model = step(model)"] * 90 + ["    return model", ""]
    + [f"def load{i}():\n    return load{i + 1}()\n" for i in range(4, 0, -1)]
    + ["model = FSDP(load1())", ""])


class AnalysisCutOff(Rule):
    code = "FSDP905"
    name = "analysis-cut-off"
    severity = Severity.INFO
    summary = "The bounds on the work per file stopped the analysis from following a helper: findings there may be missing."
    doc = """
    ## What it does
    Says, once per file and bound, where the static analysis stopped following the code: a helper called
    more helper calls deep than it follows (8), or called after the per-file budget for deep helpers was
    spent (the calls inlined beyond four helper calls deep). What that helper does to the model is not
    seen, so a finding it would cause is missing rather than cleared.

    ## Why is this bad?
    Without it, "All checks passed" cannot be told apart from "this part was not read".

    ## Example
    A loader reached through nine nested helpers.

    ## Use instead
    Call the loader through fewer levels of helpers, or check the model itself with `fsdplint model` /
    `fsdplint.check(model)`.

    ## Fix safety
    No fix.

    ## Versions
    All versions.

    ## References
    - ruff's and mypy's own notes on skipped analysis (mypy `--follow-imports`)
    """
    VALID = [
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
        "from transformers import AutoModelForCausalLM\n\n\ndef load():\n    return AutoModelForCausalLM.from_pretrained('m')\n\n\n"
        "model = FSDP(load())\n",
        # Seven helpers deep: within the bound.
        _chain(7, 'return AutoModelForCausalLM.from_pretrained("m")'),
        # The helper past the bound does nothing the analysis could miss.
        _chain(9, "return None", wrap="model = FSDP(AutoModelForCausalLM.from_pretrained('m')); load1()"),
    ]
    INVALID = [
        Invalid(_DEEP_CHAIN, line=18),
        Invalid(_chain(10, 'return AutoModelForCausalLM.from_pretrained("m")'), line=12),
        Invalid(_BUDGET, line=41),
    ]

    def check(self, ctx) -> None:
        for _kind, call, what in getattr(ctx.analysis, "cutoffs", ()):
            ctx.report(call.node, f"The analysis stopped here: {what} is not followed, so what it does to the model "
                                  f"is not checked (a finding there may be missing). Call it through fewer "
                                  f"helpers, or check the built model "
                                  f"(`fsdplint model` / fsdplint.check(model)).")
