import re

import libcst as cst

from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import Replace, safe
from fsdplint.rule import IN_FSDP_JOB, Invalid, Rule

# Code that changes requires_grad; after the optimizer it makes filtering at construction time wrong.
_REQUIRES_GRAD_CHANGE = re.compile(r"\.requires_grad\s*=(?!=)|requires_grad_\(|\bunfreeze|\bset_trainable")


class OptimizerOverFrozenParams(Rule):
    code = "FSDP103"
    name = "optimizer-over-frozen-params"
    severity = Severity.INFO
    sides = "S"
    fix = Applicability.SAFE
    summary = "optimizer given all params instead of the trainable ones"
    doc = """
    ## What it does
    Finds an optimizer built from `model.parameters()` after LoRA was injected into the model (or part of
    it was frozen), instead of from the trainable parameters only.

    ## Why is this bad?
    Usually nothing breaks: torch optimizers skip parameters whose `.grad` is `None`. But the frozen base
    is most of the model: optimizers that allocate state eagerly (some 8-bit and fused optimizers), weight
    decay applied to every parameter, per-group learning rates and parameter counts in logs all see
    billions of parameters that never train. Passing the trainable ones says what is meant.

    ## Example
    ```python
    model = get_peft_model(model, lora_config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ```

    ## Use instead
    ```python
    model = get_peft_model(model, lora_config)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ```

    ## Fix safety
    Safe: the frozen parameters never receive a gradient, so the optimizer skipped them anyway. No fix is
    offered when the script changes `requires_grad` after building the optimizer (parameters unfrozen later
    would then be left out).

    ## Versions
    All versions.

    ## References
    - mosaicml/composer#2355
    """
    references = ("mosaicml/composer#2355",)

    VALID = [
        # A test file: only another test shards; this one trains a plain LoRA model.
        """
        import torch
        from peft import LoraConfig, get_peft_model
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def test_lora_trains():
            model = get_peft_model(make_model(), LoraConfig(target_modules=["lin0"]))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model(torch.ones(2, 8)).sum().backward()
            optimizer.step()

        def test_fsdp_wrap():
            FSDP(get_peft_model(make_model(), LoraConfig(target_modules=["lin0"])), use_orig_params=True)
        """,
        # A plain LoRA script with no FSDP anywhere in its job: not fsdplint's to judge (peft's examples).
        """
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("org/model")
        model = get_peft_model(model, LoraConfig(target_modules=["q_proj", "v_proj"]))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        """,
        """
        import torch
        from peft import get_peft_model
        model = get_peft_model(model, lora_config)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        """,
        """
        import torch
        from peft import get_peft_model as add_lora
        model = add_lora(model, cfg)
        params = filter(lambda p: p.requires_grad, model.parameters())
        optimizer = torch.optim.AdamW(params, lr=1e-4)
        """,
        # Full fine-tuning: every parameter trains.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        """,
        # A helper of the model decides which parameters train.
        """
        import torch
        from peft import get_peft_model
        model = get_peft_model(model, cfg)
        optimizer = torch.optim.AdamW(get_param_groups(model, weight_decay=0.1), lr=1e-4)
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from peft import get_peft_model
            model = get_peft_model(model, lora_config)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            """,
            options=IN_FSDP_JOB,
            line=4,
            expected_fix="""
            import torch
            from peft import get_peft_model
            model = get_peft_model(model, lora_config)
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
            """,
        ),
        Invalid(
            """
            import bitsandbytes as bnb
            import torch.distributed.fsdp as f
            from peft import get_peft_model as add_lora

            def main(model, cfg):
                peft_model = add_lora(model, cfg)
                for layer in model.base_model.model.model.layers:
                    f.fully_shard(layer)
                f.fully_shard(model)
                opt = bnb.optim.AdamW8bit(params=peft_model.parameters())
            """,
            line=10,
            expected_fix="""
            import bitsandbytes as bnb
            import torch.distributed.fsdp as f
            from peft import get_peft_model as add_lora

            def main(model, cfg):
                peft_model = add_lora(model, cfg)
                for layer in model.base_model.model.model.layers:
                    f.fully_shard(layer)
                f.fully_shard(model)
                opt = bnb.optim.AdamW8bit(params=[p for p in peft_model.parameters() if p.requires_grad])
            """,
        ),
        # The usual `main()` called once under `if __name__ == "__main__":` is fixed too.
        Invalid(
            """
            import torch
            from peft import LoraConfig, get_peft_model

            def main():
                model = get_peft_model(base, LoraConfig(target_modules=["q_proj"]))
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

            if __name__ == "__main__":
                main()
            """,
            options=IN_FSDP_JOB,
            line=6,
            expected_fix="""
            import torch
            from peft import LoraConfig, get_peft_model

            def main():
                model = get_peft_model(base, LoraConfig(target_modules=["q_proj"]))
                optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

            if __name__ == "__main__":
                main()
            """,
        ),
        # Frozen by hand, then the optimizer over everything.
        Invalid(
            """
            from torch.optim import AdamW
            for name, p in model.named_parameters():
                if "lora_" not in name:
                    p.requires_grad = False
            opt = AdamW(model.parameters())
            """,
            options=IN_FSDP_JOB,
            line=5,
        ),
        # Unfrozen later: still reported, but no fix (the filtered list would miss those parameters).
        Invalid(
            """
            import torch
            from peft import get_peft_model
            model = get_peft_model(model, lora_config)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model.base_model.model.lm_head.weight.requires_grad = True
            """,
            options=IN_FSDP_JOB,
            line=4,
            expected_fix=None,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        for t in a.timelines:
            for opt in t.of("optimizer"):
                call = opt.call
                if opt.entity is None or opt.data.get("filtered") or call is None:
                    continue
                params = opt.data.get("params")
                if not _is_parameters_call(params):
                    continue  # `named_parameters()` is another bug; bound names are followed but not rewritten
                if not t.before(opt, ("lora", "freeze")):
                    continue
                if id(call) in a._test_fsdp[0] and not a.fsdp_at(call):
                    continue  # a test of its own that never shards (FSDP is only in other tests of the file)
                ctx.report(
                    params,
                    "The optimizer is given every parameter of a model whose base is frozen: it also tracks the "
                    "frozen parameters, which never train (eager-state optimizers allocate for them; weight decay "
                    "and parameter counts include them). Pass the trainable ones: "
                    "[p for p in model.parameters() if p.requires_grad].",
                    fix=_filter_fix(ctx, opt, params),
                )


def _is_parameters_call(expr) -> bool:
    return (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "parameters"
        and not expr.args
    )


def _filter_fix(ctx, opt, params):
    start = ctx.line(opt.node)
    if any(_REQUIRES_GRAD_CHANGE.search(line) for line in ctx.source.splitlines()[start:]):
        return None
    if not _single_call_path(ctx.analysis, opt.step.prefix):
        return None  # inside a helper that other call sites may use differently
    text = ctx.code(params)
    return safe("Pass only the trainable parameters", Replace(params, f"[p for p in {text} if p.requires_grad]"))


def _single_call_path(a, prefix: str) -> bool:
    """Every helper inlined on the way to the optimizer (`main@12:`) is called once in the file."""
    for name in re.findall(r"(\w+)@\d+:", prefix):
        if sum(1 for c in a.c.calls if c.func and c.func.rsplit(".", 1)[-1] == name) != 1:
            return False
    return True
