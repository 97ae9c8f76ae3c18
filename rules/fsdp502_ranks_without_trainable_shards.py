from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.rule import Rule


class RanksWithoutTrainableShards(Rule):
    code = "FSDP502"
    name = "ranks-without-trainable-shards"
    severity = Severity.INFO
    summary = 'at world size N some ranks hold no trainable elements ("clip_grad_norm_ ... with no gradients" warning)'
    sides = "AR"
    doc = """
    ## What it does
    Maps each rank's shard of every unit (FSDP1 flat-parameter chunks, FSDP2 dim-0 DTensor chunks) against
    the trainable parameters at the planned world size, and lists ranks that hold no trainable element.

    ## Why is this bad?
    Usually benign: FSDP1's `clip_grad_norm_` warns `Called FSDP.clip_grad_norm_() on rank 1 with no
    gradients -- returning the total norm in the default dtype torch.float32` and the norm is still
    all-reduced. It reveals a layout where LoRA weights sit in a narrow slice of a large flat parameter
    (frozen and trainable mixed with `use_orig_params=True`), wasting gradient memory on every rank.

    ## Example
    FSDP1, transformer-layer policy, `use_orig_params=True`, LoRA on `q_proj` only, 8 ranks.

    ## Use instead
    Wrap LoRA layers in their own units (peft's `fsdp_auto_wrap_policy`), or filter the warning.

    ## Fix safety
    No fix.

    ## Versions
    FSDP1 (the warning); the layout applies to FSDP2 shards too.

    ## References
    - PyTorch FSDP1 `clip_grad_norm_` source
    - facebookresearch/fairseq2 src/fairseq2/nn/utils/gradient.py
    """
    AUDIT_VALID = [
        spec(lora={"r": 8, "target_modules": ["q_proj"]}, fsdp={"world_size": 8}),
        spec(lora={"r": 8, "target_modules": ["q_proj"]}, fsdp={"version": 1, "auto_wrap_policy": "peft",
                                                                 "world_size": 8}),
    ]
    AUDIT_INVALID = [
        spec(lora={"r": 8, "target_modules": ["q_proj"]}, fsdp={"version": 1, "use_orig_params": True,
                                                                 "world_size": 8}),
    ]

    def audit(self, ctx):
        plan = ctx.plan
        if any(p.requires_grad for p in plan.ignored + plan.unmanaged):
            return  # replicated trainable params give every rank gradients
        ws = plan.world_size
        have = [any(u.trainable_elems[r] for u in plan.units if u.trainable_elems) for r in range(ws)]
        empty = [r for r in range(ws) if not have[r]]
        if not empty or len(empty) == ws:
            return  # none empty, or nothing trains at all (reported by other rules)
        ctx.report(self, f"at world size {ws}, {len(empty)} of {ws} ranks ({_ranges(empty)}) hold no trainable "
                         f"elements in their shards: FSDP1's clip_grad_norm_ warns \"with no gradients\" there, "
                         f"and their gradient buffers are spent on frozen weights. Wrap LoRA layers in their own "
                         f"units (peft's fsdp_auto_wrap_policy) if that matters.", field="fsdp.world_size")


def _ranges(ranks):
    out, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)
