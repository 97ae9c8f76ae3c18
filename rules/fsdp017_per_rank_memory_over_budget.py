from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.rule import Rule


class PerRankMemoryOverBudget(Rule):
    code = "FSDP017"
    name = "per-rank-memory-over-budget"
    severity = Severity.WARNING
    summary = ("the per-rank memory estimate (params, grads, AdamW state, largest all-gathered unit, activations "
               "with --seq-len) exceeds --gpu-memory")
    sides = "AR"
    doc = """
    ## What it does
    Estimates the memory each rank needs at the planned world size — its parameter shards (read from the
    real DTensor shards for FSDP2), gradients and AdamW state for trainable parameters only, unsharded
    (ignored) parameters and the 4-bit quant_state, and the largest unit while all-gathered — and warns
    when it exceeds the GPU memory given with `--gpu-memory` (or `gpu_memory` in the audit spec).
    With `--seq-len` (and `--micro-batch`, `--activation-checkpointing`, or a `training` section in the
    spec) the activations of one training step are added: the model's own forward and backward run on
    the meta device at that shape while every tensor they allocate is counted.

    ## Why is this bad?
    The job would run out of memory at the first step. Without `--seq-len`, activations come on top of
    the estimate.

    ## Example
    `fsdplint model llama3_70b.json --fsdp 2 --world-size 2 --gpu-memory 80GiB`

    `fsdplint model llama3_8b.json --world-size 8 --seq-len 4096 --micro-batch 2 --activation-checkpointing
    --gpu-memory 24GiB`

    ## Use instead
    More ranks, 4-bit base weights (FSDP1 with `bnb_4bit_quant_storage`), smaller units, or CPU offload.

    ## Fix safety
    No automatic fix.

    ## Versions
    All versions.

    ## References
    - torch `_fully_shard.py` (sharding by dim-0 chunks); torch `optim/adam.py` (state in the param dtype;
      `step` a float32 scalar on the CPU unless fused or capturable)
    - bitsandbytes `functional.py` `quantize_4bit` (QuantState: absmax per block, code, nested state)
    """
    AUDIT_VALID = [spec(gpu_memory="80GiB"), spec(),
                   spec(gpu_memory="80GiB", training={"seq_len": 4096, "micro_batch": 2,
                                                      "activation_checkpointing": True})]
    AUDIT_INVALID = [spec(gpu_memory="100KiB"),
                     # Fits before activations (about 100 KiB), not with them.
                     spec(gpu_memory="1MiB", training={"seq_len": 1024, "micro_batch": 2})]

    def audit(self, ctx):
        from fsdplint.audit.memory import fmt_bytes

        budget = ctx.spec.gpu_memory
        mem = ctx.memory
        if not budget or mem.total <= budget:
            return
        parts = ", ".join(f"{ln.label.split(' (')[0]} {fmt_bytes(ln.bytes)}" for ln in mem.lines
                          if ln.bytes and ln.on_device)
        act = mem.activations
        if act is None:
            when, advice = "before activations", ""
        else:
            when = (f"with activations for micro-batch {act.micro_batch} x seq {act.seq_len}"
                    f"{' and activation checkpointing' if act.checkpointing else ''}")
            advice = (" a smaller micro-batch," if act.checkpointing
                      else " activation checkpointing, a smaller micro-batch,")
        ctx.report(self, f"rank {mem.rank} needs about {fmt_bytes(mem.total)} at world size {mem.world_size} "
                         f"({when}), over the {fmt_bytes(budget)} budget: {parts}. Use more ranks,{advice} "
                         f"smaller units, 4-bit base weights or CPU offload.", field="gpu_memory")
