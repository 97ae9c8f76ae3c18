from fsdplint.analysis import UNKNOWN
from fsdplint.findings import Applicability, Severity
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._checkpointing import hf_checkpointing


class DdpFindUnusedReentrant(Rule):
    code = "FSDP109"
    name = "ddp-find-unused-reentrant"
    severity = Severity.ERROR
    summary = "DDP `find_unused_parameters=True` with reentrant checkpointing and LoRA."
    sides = "S"
    needs_fsdp = False  # a DDP bug: reported whether or not FSDP is in the job
    fix = Applicability.SAFE
    versions = {"transformers": "<5.0"}
    doc = """
    ## What it does
    Finds `DistributedDataParallel(find_unused_parameters=True)`,
    `TrainingArguments(ddp_find_unused_parameters=True)` or accelerate's
    `DistributedDataParallelKwargs(find_unused_parameters=True)` in a LoRA script that also turns on
    reentrant Hugging Face gradient checkpointing (`use_reentrant=True`, or the transformers default
    before v5).

    ## Why is this bad?
    Reentrant checkpointing runs each layer's forward again inside backward, which fires DDP's autograd
    hooks for the LoRA parameters a second time. With `find_unused_parameters=True` DDP tracks every
    parameter's readiness and aborts: `RuntimeError: Expected to mark a variable ready only once ...
    has been marked as ready twice`.

    ## Example
    ```python
    TrainingArguments(gradient_checkpointing=True, ddp_find_unused_parameters=True)
    ```

    ## Use instead
    ```python
    TrainingArguments(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False},
                      ddp_find_unused_parameters=False)
    ```

    ## Fix safety
    Safe: the fix switches the checkpointing call to `use_reentrant=False` (same gradients, and
    non-reentrant checkpointing works with `find_unused_parameters=True`); `find_unused_parameters` is
    left as written.

    ## Versions
    All torch versions. transformers before 5.0 default to reentrant checkpointing; from v5 only an
    explicit `use_reentrant=True` is reported.

    ## References
    - peft#313; accelerate#2017; trl#921, #4782
    """
    references = ("peft#313", "accelerate#2017", "trl#921")

    VALID = [
        """
        from transformers import TrainingArguments
        from peft import LoraConfig
        peft_config = LoraConfig(r=16)
        args = TrainingArguments(output_dir="o", gradient_checkpointing=True,
                                 gradient_checkpointing_kwargs={"use_reentrant": False},
                                 ddp_find_unused_parameters=True)
        """,
        """
        from transformers import TrainingArguments
        from peft import LoraConfig
        peft_config = LoraConfig(r=16)
        args = TrainingArguments(output_dir="o", gradient_checkpointing=True, ddp_find_unused_parameters=False)
        """,
        # No checkpointing: find_unused_parameters is just slower.
        """
        from torch.nn.parallel import DistributedDataParallel as DDP
        from peft import get_peft_model
        model = get_peft_model(model, cfg)
        model = DDP(model, device_ids=[rank], find_unused_parameters=True)
        """,
        # No LoRA.
        """
        from torch.nn.parallel import DistributedDataParallel as DDP
        model.gradient_checkpointing_enable()
        model = DDP(model, find_unused_parameters=True)
        """,
        Valid(
            """
            from transformers import TrainingArguments
            from peft import LoraConfig
            peft_config = LoraConfig(r=16)
            args = TrainingArguments(output_dir="o", gradient_checkpointing=True, ddp_find_unused_parameters=True)
            """,
            target={"transformers": "5.3"},
        ),
    ]
    INVALID = [
        Invalid(
            """
            from transformers import TrainingArguments
            from peft import LoraConfig
            peft_config = LoraConfig(r=16)
            args = TrainingArguments(output_dir="o", gradient_checkpointing=True, ddp_find_unused_parameters=True)
            """,
            line=4,
            expected_fix="""
            from transformers import TrainingArguments
            from peft import LoraConfig
            peft_config = LoraConfig(r=16)
            args = TrainingArguments(output_dir="o", gradient_checkpointing=True, ddp_find_unused_parameters=True, gradient_checkpointing_kwargs={"use_reentrant": False})
            """,
        ),
        Invalid(
            """
            import torch.nn.parallel as par
            from peft import get_peft_model as add_lora
            model = add_lora(model, cfg)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
            model = par.DistributedDataParallel(model, device_ids=[rank], find_unused_parameters=True)
            """,
            line=5,
            target={"transformers": "5.3"},
            expected_fix="""
            import torch.nn.parallel as par
            from peft import get_peft_model as add_lora
            model = add_lora(model, cfg)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model = par.DistributedDataParallel(model, device_ids=[rank], find_unused_parameters=True)
            """,
        ),
        Invalid(
            """
            from accelerate import Accelerator, DistributedDataParallelKwargs
            from peft import get_peft_model
            model = get_peft_model(model, cfg)
            model.gradient_checkpointing_enable()
            accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
            """,
            line=5,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        if not a.uses_peft:
            return
        finds = _find_unused_true(a)
        if not finds:
            return
        reentrant = [(s, why) for s in hf_checkpointing(a) for r, why in [s.reentrant(ctx)] if r]
        if not reentrant:
            return
        site, why = reentrant[0]
        for node in finds:
            ctx.report(
                node,
                f"find_unused_parameters=True with reentrant gradient checkpointing (line {ctx.line(site.node)}: {why}) "
                "on a LoRA model: the recomputed forward fires DDP's hooks twice and backward raises 'Expected to "
                "mark a variable ready only once'. Use gradient_checkpointing_kwargs={\"use_reentrant\": False} "
                "(and find_unused_parameters=False unless the model really has unused parameters).",
                fix=site.fix(),
            )


def _find_unused_true(a):
    out = []
    for c in a.calls("DDP", "DistributedDataParallelKwargs"):
        expr = a.keyword(c, "find_unused_parameters")
        if expr is not None and expr is not UNKNOWN and a.value(expr, c.scope) is True:
            out.append(c.kwarg("find_unused_parameters") or c.node)
    for c in a.calls("TrainingArguments"):
        expr = a.keyword(c, "ddp_find_unused_parameters")
        if expr is not None and expr is not UNKNOWN and a.value(expr, c.scope) is True:
            out.append(c.kwarg("ddp_find_unused_parameters") or c.node)
    return out
