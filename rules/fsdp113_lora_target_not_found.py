import difflib

from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.rule import Rule


class LoraTargetNotFound(Rule):
    code = "FSDP113"
    name = "lora-target-not-found"
    severity = Severity.ERROR
    summary = (
        "LoRA `target_modules` that match no module of the architecture (peft raises, or trains far less "
        "than intended)"
    )
    sides = "SA"
    doc = """
    ## What it does
    Applies the LoRA config with the real peft to the architecture (on the meta device) and reports target
    names that match no module: when none match, peft raises `ValueError: Target modules {...} not found
    in the base model`; when some match, peft silently drops the others.

    ## Why is this bad?
    The error surfaces only after the weights are loaded on the cluster, or — worse — training runs with a
    fraction of the intended adapters (e.g. `"vproj"` for `"v_proj"`, or `"query_key_value"` on Llama).

    ## Example
    ```python
    LoraConfig(target_modules=["q_proj", "vproj"])
    ```

    ## Use instead
    ```python
    LoraConfig(target_modules=["q_proj", "v_proj"])
    ```

    ## Fix safety
    No automatic fix: the intended module is a guess (the message suggests close names).

    ## Versions
    All peft versions.

    ## References
    - peft `check_target_module_exists` (peft/tuners/tuners_utils.py)
    """
    AUDIT_VALID = [spec(), spec(lora={"r": 8, "target_modules": "all-linear"})]
    AUDIT_INVALID = [
        spec(lora={"r": 8, "target_modules": ["q_proj", "vproj"]}),
        spec(lora={"r": 8, "target_modules": ["query_key_value"]}),
    ]

    def audit(self, ctx):
        built = ctx.built
        for message, _, fieldpath in ctx.problems(self.code):
            ctx.report(self, message + self._suggest(ctx, built.user_targets or []), field=fieldpath)
        if not built.lora_applied:
            return
        for cov in built.coverage:
            if cov.modules == 0:
                ctx.report(self, f"LoRA target {cov.target!r} matches no module of {built.architecture}: peft "
                                 f"drops it silently and trains fewer adapters than configured."
                                 + self._suggest(ctx, [cov.target]), field="lora.target_modules")

    @staticmethod
    def _suggest(ctx, targets) -> str:
        import torch.nn as nn

        leaves = sorted({n.rsplit(".", 1)[-1] for n, m in ctx.built.base.named_modules()
                         if isinstance(m, nn.Linear) or type(m).__name__ in ("Linear4bit", "Linear8bitLt")})
        leaves = [n for n in leaves if n not in ("base_layer", "default")]
        close = sorted({c for t in targets for c in difflib.get_close_matches(t, leaves, n=3, cutoff=0.6)})
        shown = close or leaves[:8]
        return f" {'Did you mean' if close else 'Linear modules here'}: {', '.join(shown)}." if shown else ""
