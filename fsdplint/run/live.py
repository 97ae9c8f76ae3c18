"""At the stop point: the runtime guard's checks and the per-rank memory of the live model.

The checks are `fsdplint.check`'s local ones (fsdplint/runtime), run on the model and optimizer the
job built; the memory is read from the rank's real shards (DTensor local shards for FSDP2, the
FlatParameter shards for FSDP1), with gradients and AdamW's two fp32 states for what is trainable.
"""

from __future__ import annotations


def checks(model, optimizer) -> list[dict]:
    from fsdplint.runtime.local_checks import local_findings
    from fsdplint.runtime.units import scan_model

    scan = scan_model(model)
    return [f.to_json() for f in local_findings(scan, optimizer)]


def memory(model, optimizer) -> dict:
    """Bytes this rank holds for parameters, gradients and optimizer state."""
    seen = set()
    params = grads = states = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        t = p.to_local() if hasattr(p, "to_local") else p
        n = t.numel() * t.element_size()
        params += n
        if p.requires_grad:
            grads += n
            trainable = t.numel()
            infos = getattr(p, "_shard_param_infos", None)
            if infos is not None and getattr(p, "_params", None) is not None:  # FSDP1 use_orig_params
                trainable = sum(i.numel_in_shard or 0 for i, q in zip(infos, p._params) if i.in_shard and q.requires_grad)
            states += 2 * 4 * trainable  # AdamW: exp_avg and exp_avg_sq in float32
    if optimizer is None:
        states = 0
    return {"params": params, "grads": grads, "optimizer": states, "total": params + grads + states}
