import difflib

from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules import _lora_targets


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

    In scripts, checks the literal `target_modules` of each `LoraConfig` against the module names of the
    architecture, when it is known: from the `--model` config (`model_type`), or from a well-known model id
    passed to `from_pretrained` (e.g. `meta-llama/Llama-3.1-8B`). Without a known architecture, a name is
    reported only when it exists in no known family (llama, mistral, mixtral, qwen2/3(-moe), gemma 1-3,
    phi/phi3, gpt2, gpt-neox, falcon, gpt-oss, t5, bert, ...) and is a near-miss of a real name (`"vproj"`).

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
    VALID = [
        """
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")
        cfg = LoraConfig(r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        """,
        # Names of a custom model are not guessed at.
        """
        from peft import LoraConfig as LC
        cfg = LC(r=8, target_modules=["to_q", "to_k", "to_v", "to_out.0"])
        """,
        # Regex / all-linear strings are left to the model audit.
        """
        from peft import LoraConfig
        cfg = LoraConfig(r=8, target_modules=r".*\\.(q|v)_proj")
        cfg2 = LoraConfig(r=8, target_modules="all-linear")
        """,
        """
        import peft
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("EleutherAI/pythia-1b")
        cfg = peft.LoraConfig(target_modules=["query_key_value", "dense_h_to_4h"])
        """,
        Valid(
            """
            from peft import LoraConfig
            cfg = LoraConfig(r=8, target_modules=["w1", "w2", "w3", "q_proj"])
            """,
            options={"model_config": {"model_type": "mixtral"}},
        ),
    ]
    INVALID = [
        Invalid(
            """
            from peft import LoraConfig
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained("meta-llama/Meta-Llama-3-8B")
            cfg = LoraConfig(r=16, target_modules=["query_key_value"])
            """,
            line=4,
        ),
        Invalid(
            """
            from peft import LoraConfig as LC
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained(model_name)
            cfg = LC(r=16, target_modules=["q_proj", "vproj"])
            """,
            line=4,
        ),
        Invalid(
            """
            import peft
            targets = ["q_proj", "v_proj", "gate_up_proj"]
            cfg = peft.LoraConfig(r=8, target_modules=targets)
            """,
            line=3,
            options={"model_config": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}},
        ),
    ]

    def check(self, ctx) -> None:
        _lora_targets.check(self, ctx)

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
