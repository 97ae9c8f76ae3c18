from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.rule import Rule


class PerRankMemoryOverBudget(Rule):
    code = "FSDP017"
    name = "per-rank-memory-over-budget"
    severity = Severity.WARNING
    summary = "the per-rank memory estimate (params, grads, AdamW state, largest all-gathered unit) exceeds --gpu-memory"
    sides = "A"
    doc = """
    ## What it does
    Estimates the memory each rank needs at the planned world size — its parameter shards (read from the
    real DTensor shards for FSDP2), gradients and AdamW state for trainable parameters only, unsharded
    (ignored) parameters, and the largest unit while all-gathered — and warns when it exceeds the GPU
    memory given with `--gpu-memory` (or `gpu_memory` in the audit spec).

    ## Why is this bad?
    The job would run out of memory before the first step; activations come on top of the estimate.

    ## Example
    `fsdplint model llama3_70b.json --fsdp 2 --world-size 2 --gpu-memory 80GiB`

    ## Use instead
    More ranks, 4-bit base weights (FSDP1 with `bnb_4bit_quant_storage`), smaller units, or CPU offload.

    ## Fix safety
    No automatic fix.

    ## Versions
    All versions.

    ## References
    - torch `_fully_shard.py` (sharding by dim-0 chunks); torch `optim/adamw.py` (state in the param dtype)
    """
    AUDIT_VALID = [spec(gpu_memory="80GiB"), spec()]
    AUDIT_INVALID = [spec(gpu_memory="100KiB")]

    def audit(self, ctx):
        from fsdplint.audit.memory import fmt_bytes

        budget = ctx.spec.gpu_memory
        mem = ctx.memory
        if not budget or mem.total <= budget:
            return
        parts = ", ".join(f"{ln.label.split(' (')[0]} {fmt_bytes(ln.bytes)}" for ln in mem.lines if ln.bytes)
        ctx.report(self, f"rank {mem.rank} needs about {fmt_bytes(mem.total)} at world size {mem.world_size} "
                         f"(before activations), over the {fmt_bytes(budget)} budget: {parts}. Use more ranks, "
                         f"smaller units, 4-bit base weights or CPU offload.", field="gpu_memory")
