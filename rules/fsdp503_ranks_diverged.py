from fsdplint.findings import Severity
from fsdplint.rule import Rule


class RanksDiverged(Rule):
    code = "FSDP503"
    name = "ranks-diverged"
    severity = Severity.ERROR
    sides = "R"
    summary = "Ranks hold different trainable parameters (names, shapes, dtypes) or different LoRA initial values."
    doc = """
    ## What it does
    Runtime only (`fsdplint.check(model)`): every rank sends a small fingerprint of its trainable
    parameters — names, shapes, dtypes and, for replicated LoRA weights, checksums of the initial
    values — in one small collective; rank 0 compares them and every rank raises the same error.

    ## Why is this bad?
    Ranks that were initialised differently (LoRA injected after wrapping with a per-rank seed, a
    config that differs per rank, replicas of an HSDP group seeded apart) train different models.
    Nothing fails: the gradients are averaged over mismatched weights and the saved adapter is
    rank 0's alone.

    ## Example
    ```python
    torch.manual_seed(rank)            # a different seed on every rank
    model = get_peft_model(model, cfg) # ... after fully_shard: adapters differ per rank
    ```

    ## Use instead
    Seed identically on every rank before building the model, inject LoRA before wrapping, and
    build the same config on every rank.

    ## Fix safety
    No fix.

    ## Versions
    All versions.

    ## References
    - transformers#48792 (comment): "N ranks train N different adapters and rank 0's is the one saved"
    """
    references = ("transformers#48792",)
