import libcst as cst

from fsdplint.facts import MEASURED, Fact
from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import Replace, safe
from fsdplint.resolve import dotted
from fsdplint import behaviour
from fsdplint.rule import Invalid, Rule, Valid


class WrongClipGradNorm(Rule):
    code = "FSDP501"
    name = "wrong-clip-grad-norm"
    severity = Severity.ERROR
    summary = (
        "`torch.nn.utils.clip_grad_norm_` on an FSDP1 model (per-rank norms); FSDP2 norm logged without "
        "`.full_tensor()` on a torch not measured to return it whole (warning)."
    )
    sides = "S"
    fix = Applicability.SAFE
    doc = """
    ## What it does
    Finds `torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)` on a model wrapped with
    `FullyShardedDataParallel`, and, for `fully_shard` (FSDP2) models, the returned norm read with
    `.item()` instead of `.full_tensor().item()`.

    ## Why is this bad?
    Under FSDP1 each rank holds only a shard of every gradient, so the torch function computes a
    different, partial norm on each rank and scales each shard by a different factor: the clipped update
    is wrong and ranks drift apart. `FullyShardedDataParallel.clip_grad_norm_` all-reduces the norm first.
    Measured on CPU with 2 gloo ranks (`python bench/facts/fsdp501_cpu_check.py`, torch 2.13.0):
    `torch.nn.utils.clip_grad_norm_` over an FSDP1 module's parameters returned 9.885 on rank 0 and
    20.238 on rank 1 where the unsharded norm is 22.523; `FullyShardedDataParallel.clip_grad_norm_`
    returned 22.523 on both.

    Under FSDP2 `clip_grad_norm_` clips correctly (the norm is a DTensor). On torch 2.13 the returned
    norm is a `Replicate` DTensor and `.item()` is the global norm on every rank (measured, equal to the
    unsharded copy's). On older releases the norm may still be a partial DTensor, whose `.item()` is this
    rank's part; that was not measured or bisected, so the FSDP2 finding is a warning, and is not
    reported for torch >= 2.13.

    ## Example
    ```python
    model = FSDP(model)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    ```

    ## Use instead
    ```python
    model = FSDP(model)
    model.clip_grad_norm_(1.0)
    ```
    FSDP2: `norm = clip_grad_norm_(model.parameters(), 1.0); log(norm.full_tensor().item())`.

    ## Fix safety
    Safe for FSDP1 when the parameters are `model.parameters()` of the FSDP root and only `max_norm` /
    `norm_type` are passed: `FullyShardedDataParallel.clip_grad_norm_(max_norm, norm_type)` clips the same
    parameters with the global norm and returns it. No fix for FSDP2 (a logging change).

    ## Versions
    FSDP1: all versions (measured on torch 2.13.0). FSDP2 `.item()`: a warning below torch 2.13.0 or on
    an unknown torch (behaviour `fsdp2_clip_norm_replicated`, unverified below 2.13.0); silent from 2.13.0.

    ## References
    - pytorch#90028, #126457, #170862; torchtune#2169; torchtitan docs; miles_diffusion#35
    """
    references = ("pytorch#90028", "pytorch#126457", "torchtune#2169")

    facts = (
        Fact("torch.nn.utils.clip_grad_norm_ over an FSDP1 module's parameters returns a different, partial norm "
             "on each rank; FullyShardedDataParallel.clip_grad_norm_ returns the global one",
             "torch 2.13.0", MEASURED,
             "2 gloo ranks: 9.885 (rank 0) and 20.238 (rank 1) against an unsharded 22.523; the method: 22.523",
             "python bench/facts/fsdp501_cpu_check.py"),
        Fact("FSDP2: the norm clip_grad_norm_ returns is a Replicate DTensor whose .item() is the global norm",
             "torch 2.13.0 (older releases not run: a warning there)", MEASURED,
             "DTensor placements ['R'], .item() equal to the unsharded norm on both ranks; get_total_norm(foreach=True) "
             "alike",
             "python bench/facts/fsdp501_cpu_check.py"),
    )

    VALID = [
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, use_orig_params=True)
        model.clip_grad_norm_(1.0)
        """,
        # FSDP2: the torch function is right; the norm is made whole before logging.
        """
        import torch
        from torch.distributed.fsdp import fully_shard
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        print(norm.full_tensor().item())
        """,
        # FSDP2 on torch 2.13: the returned norm is Replicate, .item() is the global norm (measured).
        Valid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard
            for layer in model.layers:
                fully_shard(layer)
            fully_shard(model)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            print(norm.item())
            """,
            target={"torch": "2.13.0"},
        ),
        # Clipping before wrapping (e.g. a single-GPU debug path) is not under FSDP.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        other = FSDP(other_model)
        """,
        """
        from accelerate import Accelerator
        accelerator = Accelerator()
        model = accelerator.prepare(model)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        """,
        # Made whole on the chained call.
        """
        import torch
        from torch.distributed.fsdp import fully_shard
        fully_shard(model)
        print(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).full_tensor().item())
        """,
    ]
    INVALID = [
        # `.item()` chained on the FSDP2 clip call: this rank's partial norm.
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard
            fully_shard(model)
            print(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())
            """,
            line=4,
            target={"torch": "2.6"},
            severity="warning",
        ),
        # The norm half of clip_grad_norm_, over an FSDP1 model's local shards.
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model)
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, auto_wrap_policy=policy)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            """,
            line=4,
            expected_fix="""
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, auto_wrap_policy=policy)
            model.clip_grad_norm_(max_norm=1.0)
            """,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as f
            from torch.nn.utils import clip_grad_norm_ as clip

            def train(model, loader, opt):
                model = f.FullyShardedDataParallel(model)
                for batch in loader:
                    model(batch).loss.backward()
                    gnorm = clip(model.parameters(), 1.0, 2.0)
                    opt.step()
            """,
            line=8,
            expected_fix="""
            import torch.distributed.fsdp as f
            from torch.nn.utils import clip_grad_norm_ as clip

            def train(model, loader, opt):
                model = f.FullyShardedDataParallel(model)
                for batch in loader:
                    model(batch).loss.backward()
                    gnorm = model.clip_grad_norm_(1.0, 2.0)
                    opt.step()
            """,
        ),
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import fully_shard
            for layer in model.layers:
                fully_shard(layer)
            fully_shard(model)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            print(norm.item())
            """,
            line=7,
            target={"torch": "2.6"},
            severity="warning",
        ),
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model)
            params = [p for p in model.parameters() if p.requires_grad]
            torch.nn.utils.clip_grad.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
            """,
            line=5,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        for t in a.timelines:
            for ev in t.of("clip"):
                if not ev.data.get("torch_api") or ev.entity is None:
                    continue
                state = t.wrap_state(ev.entity, ev.seq, at=ev)
                if state == "fsdp1" and ev.data.get("norm_only"):
                    ctx.report(
                        ev.node,
                        "torch.nn.utils.get_total_norm over the gradients of an FSDP1 model sees only this "
                        "rank's gradient shards: each rank computes a different norm. Use "
                        "model.clip_grad_norm_(max_norm) on the FullyShardedDataParallel module, which returns "
                        "the norm over all ranks.",
                    )
                elif state == "fsdp1":
                    ctx.report(
                        ev.node,
                        "torch.nn.utils.clip_grad_norm_ on an FSDP1 model sees only this rank's gradient shards: "
                        "each rank computes a different norm and clips by a different factor. Call "
                        "model.clip_grad_norm_(max_norm) on the FullyShardedDataParallel module instead.",
                        fix=_fsdp1_fix(ctx, ev.call),
                    )
                elif state == "fsdp2":
                    torch_v = ctx.version("torch")
                    if behaviour.holds("fsdp2_clip_norm_replicated", torch_v):
                        continue  # measured: a Replicate norm, .item() is the global norm
                    for item in _item_reads(a, ev.call):
                        ctx.report(
                            item.node,
                            "The norm returned by clip_grad_norm_ on an FSDP2 model is a DTensor: on torch 2.13 it "
                            "is Replicate and .item() is the global norm (measured), but on "
                            f"{torch_v.describe()} it may hold partial norms, and .item() would return this "
                            "rank's part. Use norm.full_tensor().item(), which is whole on every release, or "
                            "declare torch >= 2.13.",
                            severity=Severity.WARNING,
                            rests_on=("fsdp2_clip_norm_replicated",),
                        )


def _fsdp1_fix(ctx, call):
    if call is None:
        return None
    params = call.arg(0, "parameters")
    if not (isinstance(params, cst.Call) and isinstance(params.func, cst.Attribute)
            and params.func.attr.value == "parameters" and not params.args):
        return None
    root = dotted(params.func.value)
    if root is None or "module" in root.split(".")[1:]:
        return None  # `model.module.parameters()`: the FSDP root is not written here
    rest = [arg for arg in call.node.args if arg.value is not params]
    for arg in rest:
        if arg.star or (arg.keyword is not None and arg.keyword.value not in ("max_norm", "norm_type")):
            return None  # error_if_nonfinite / foreach have no FSDP1 equivalent
    text = ", ".join(ctx.code(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT)) for arg in rest)
    return safe("Use the FSDP module's clip_grad_norm_", Replace(call.node, f"{root}.clip_grad_norm_({text})"))


def _item_reads(a, call):
    """`norm.item()` on the name the clip result was assigned to, or `.item()` chained on the clip call
    itself — also where a helper returns it (by name or as the call) to its caller (`grad_norm =
    utils.clip_grad_norm_(...)`, `clip(...).item()`) —, unless `.full_tensor()` may run on it."""
    if call is None:
        return []
    out = []
    node, scope, holders = call.node, call.scope, []
    for _ in range(4):
        site = a.call_at(node)
        out += [c for c in scope.calls if c.receiver is node and c.method == "item"]
        if any(c.receiver is node and c.method in ("full_tensor", "redistribute") for c in scope.calls):
            return []
        targets = site.targets if site is not None else []
        if len(targets) == 1 and isinstance(targets[0], cst.Name):
            holders.append((targets[0].value, scope, site.seq))
            returned = any(isinstance(r, cst.Name) and r.value == targets[0].value for r in scope.returns)
        else:
            returned = any(r is node for r in scope.returns)
        sites = getattr(a, "_inline_sites", {}).get(id(scope), []) if returned else []
        if len(sites) != 1:
            break
        node, scope = sites[0].node, sites[0].scope
    for name, scope, seq in holders:
        same = [c for c in scope.calls if isinstance(c.receiver, cst.Name) and c.receiver.value == name]
        if any(c.method in ("full_tensor", "redistribute") and not a.cannot_run(c) for c in same):
            return []
        out += [c for c in same if c.method == "item" and c.seq > seq]
    return out
