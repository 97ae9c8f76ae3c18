import libcst as cst

from fsdplint.analysis import UNKNOWN
from fsdplint.findings import Severity
from fsdplint.rule import IN_FSDP_JOB, Invalid, Rule, Valid

from fsdplint.rules._lora_config import target_parameters


class TargetParametersWithDropout(Rule):
    code = "FSDP302"
    name = "target-parameters-with-dropout"
    severity = Severity.ERROR
    summary = "peft `target_parameters` with `lora_dropout != 0`."
    sides = "S"
    versions = {"peft": ">=0.17.0"}
    doc = """
    ## What it does
    Finds a `LoraConfig` with `target_parameters` (LoRA on raw `nn.Parameter`s, e.g. fused MoE experts)
    and a non-zero `lora_dropout`.

    ## Why is this bad?
    peft wraps targeted parameters with `lora.ParamWrapper`, which has no dropout path: `get_peft_model`
    raises `ValueError: lora.ParamWrapper does not work with lora_dropout != 0.` — after the (large)
    model has been loaded on every rank.

    ## Example
    ```python
    LoraConfig(target_parameters=["mlp.experts.gate_up_proj"], lora_dropout=0.05)
    ```

    ## Use instead
    ```python
    LoraConfig(target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], lora_dropout=0.0)
    ```

    ## Fix safety
    No automatic fix: dropout changes the training recipe, and a config that also targets modules may
    want dropout there (split it into two adapters instead).

    ## Versions
    `target_parameters` exists from peft 0.17.0 (peft#2638).

    ## References
    - peft#2638, #3009; peft docs package_reference/lora.md; peft src tuners/lora/layer.py
    """
    references = ("peft#2638", "peft#3009")

    VALID = [
        # target_parameters comes from the caller (a CLI option that defaults to None): unknown, so silent.
        Valid(
            """
            from peft import LoraConfig

            def main(model_id, target_modules, target_parameters):
                return LoraConfig(r=16, target_modules=target_modules, target_parameters=target_parameters,
                                  lora_dropout=0.05)
            """,
            options=IN_FSDP_JOB,
        ),
        """
        from peft import LoraConfig
        cfg = LoraConfig(r=16, target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], lora_dropout=0.0)
        """,
        # lora_dropout defaults to 0.
        """
        from peft import LoraConfig as LC
        cfg = LC(r=16, target_parameters=["mlp.experts.gate_up_proj"])
        """,
        # Dropout with module targets only.
        """
        from peft import LoraConfig
        cfg = LoraConfig(r=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.05)
        """,
        """
        from peft import LoraConfig
        cfg = LoraConfig(r=16, target_modules=["q_proj"], target_parameters=None, lora_dropout=0.1)
        """,
    ]
    INVALID = [
        Invalid(
            """
            from peft import LoraConfig
            cfg = LoraConfig(r=16, target_parameters=["mlp.experts.gate_up_proj"], lora_dropout=0.05)
            """,
            options=IN_FSDP_JOB,
            line=2,
        ),
        Invalid(
            """
            import peft
            dropout = 0.1
            cfg = peft.LoraConfig(
                r=8,
                target_modules=["q_proj", "v_proj"],
                target_parameters=["experts.down_proj"],
                lora_dropout=dropout,
            )
            """,
            options=IN_FSDP_JOB,
            line=7,
        ),
        Invalid(
            """
            from peft.tuners.lora import LoraConfig as LC
            kwargs = {"r": 8, "lora_dropout": 0.05}
            cfg = LC(target_parameters=["mlp.experts.gate_up_proj"], **kwargs)
            """,
            options=IN_FSDP_JOB,
            line=3,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        for call in a.calls("LoraConfig"):
            if not target_parameters(a, call):
                continue
            tp = call.kw("target_parameters")
            if isinstance(tp, cst.Name) and tp.value in call.scope.params and tp.value not in call.scope.assigns:
                continue  # the caller's value (often an optional CLI list that defaults to None): unknown
            expr = a.keyword(call, "lora_dropout")
            if expr is None or expr is UNKNOWN:
                continue
            v = a.value(expr, call.scope)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v == 0:
                continue
            ctx.report(
                call.kwarg("lora_dropout") or call.node,
                f"LoRA on target_parameters does not support dropout: get_peft_model raises 'lora.ParamWrapper does "
                f"not work with lora_dropout != 0' (lora_dropout={v}). Set lora_dropout=0.0.",
            )
