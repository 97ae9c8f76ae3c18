"""Activation memory per rank for one micro-batch: the real model's forward and backward, run on meta.

The model's own code (transformers, peft) runs a training step on meta tensors of the requested
shape while a dispatch mode keeps the bytes of every tensor storage the step creates; a storage
stops counting when it is freed. Meta tensors have sizes and no data, so this costs milliseconds
and no memory, and it sees exactly what autograd saves for the dtypes, frozen weights and
attention kernel in use. Parameter gradients are left out (the "gradients" line counts them).

With activation checkpointing, transformers' own `activation_checkpointing_enable` (non-reentrant,
as FSDP's `apply_activation_checkpointing` and `fsdp_config.activation_checkpointing` do) wraps
every decoder layer; its forward keeps only each layer's input and the backward recomputes one
layer at a time.

Three kernels are stood in for on meta (see `_meta_kernels`), each allocating what the real one
allocates: flash attention, `grouped_mm` outside bfloat16, and bitsandbytes' 4-bit matmul.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class StepTrace:
    """Storages one forward+backward created: (bytes, first op index, op index it died at or None)."""

    records: list = field(default_factory=list)
    ops: int = 0
    forward_ops: int = 0

    def peak(self, exclude: set = frozenset()) -> int:
        """Largest sum of live bytes at any op, leaving out the records whose index is in `exclude`."""
        events = []
        for i, (nbytes, born, died) in enumerate(self.records):
            if i in exclude:
                continue
            events.append((born, nbytes))
            if died is not None:
                events.append((died, -nbytes))
        live = best = 0
        # Frees at an op index are applied after its allocations: the conservative order.
        for _, delta in sorted(events, key=lambda e: (e[0], e[1] < 0)):
            live += delta
            best = max(best, live)
        return best

    def live_at(self, op: int, exclude: set = frozenset()) -> int:
        return sum(n for i, (n, b, d) in enumerate(self.records)
                   if i not in exclude and b <= op and (d is None or d > op))


def trace_step(run, *, grads_of=None) -> tuple[StepTrace, set]:
    """Run `run()` (a forward whose result is backwarded) under the tracker.

    Returns the trace and the record indices of parameter gradients in `grads_of`'s parameters.
    """
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.weak import WeakIdKeyDictionary

    trace = StepTrace()
    index = WeakIdKeyDictionary()  # storage -> record index

    class Tracker(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default and args[0].is_meta:
                # `.item()` on meta: transformers asks whether positions are packed (they are not:
                # one sequence per row) or whether a mask is all ones (it is).
                return True if args[0].dtype == torch.bool else 0
            out = func(*args, **(kwargs or {}))
            trace.ops += 1
            returns = func._schema.returns
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for pos, t in enumerate(outs):
                # A view or an in-place result shares an input's storage: nothing new is allocated.
                if pos < len(returns) and returns[pos].alias_info is not None:
                    continue
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage()
                    if st in index:
                        continue
                    i = len(trace.records)
                    trace.records.append((st.nbytes(), trace.ops, None))
                    index[st] = i

                    def freed(_ref, i=i):
                        n, b, _ = trace.records[i]
                        trace.records[i] = (n, b, trace.ops)

                    refs.append(weakref.ref(st, freed))
            return out

    refs: list = []
    with _meta_kernels(), Tracker():
        run(trace)
    grads = set()
    for p in (grads_of.parameters() if grads_of is not None else []):
        if p.grad is not None:
            i = index.get(p.grad.untyped_storage())
            if i is not None:
                grads.add(i)
    return trace, grads


@contextlib.contextmanager
def _meta_kernels():
    """On meta, `scaled_dot_product_attention` decomposes into the math kernel, which keeps the
    seq x seq attention weights for backward; accelerators (and CPUs) run a flash kernel that keeps
    the output and its log-sum-exp only. Meta calls go to the flash kernel (its meta function) so the
    step saves what a real one saves. Module attributes, not a TorchFunctionMode: the checkpoint
    recompute runs in the backward, where a mode entered around the step is no longer active."""
    import torch
    import torch.nn.functional as F

    sdpa = F.scaled_dot_product_attention

    def flash(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if not query.is_meta:
            return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]

    F.scaled_dot_product_attention = flash
    grouped = getattr(F, "grouped_mm", None)
    if grouped is not None:
        F.grouped_mm = _meta_grouped_mm(grouped)
    linear4bit = _bnb_linear4bit()
    forward4bit = linear4bit.forward if linear4bit is not None else None
    if linear4bit is not None:
        linear4bit.forward = _meta_4bit_forward(forward4bit)
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa
        if grouped is not None:
            F.grouped_mm = grouped
        if linear4bit is not None:
            linear4bit.forward = forward4bit


def _bnb_linear4bit():
    import sys

    bnb = sys.modules.get("bitsandbytes")  # only when the model was built with it
    return getattr(getattr(bnb, "nn", None), "Linear4bit", None)


def _meta_4bit_forward(forward):
    """A meta Params4bit is not quantized (no quant_state), so bnb's forward cannot run. What bnb
    0.50's `MatMul4Bit` does in a training step: the forward casts the input to the compute dtype and
    returns a new output, saving only the packed weight it already holds; the backward dequantizes
    the weight to (out, in) in the gradient's dtype and returns the input's gradient."""
    import torch

    class MatMul4BitOnMeta(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, weight_shape):
            ctx.weight_shape = weight_shape
            return a.new_empty((*a.shape[:-1], weight_shape[0]))

        @staticmethod
        def backward(ctx, grad):
            dequantized = grad.new_empty(ctx.weight_shape)  # live while the input's gradient is computed
            grad_a = grad.new_empty((*grad.shape[:-1], ctx.weight_shape[1]))
            del dequantized
            return grad_a, None

    def call(self, x):
        w = self.weight
        if not (x.is_meta and w.is_meta and getattr(w, "quant_state", None) is None):
            return forward(self, x)
        inp_dtype = x.dtype
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        out = MatMul4BitOnMeta.apply(x, tuple(w.shape))
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.to(inp_dtype)

    return call


def _meta_grouped_mm(grouped):
    """`grouped_mm`'s meta function accepts bfloat16 only (the CUDA kernel's rule) while the CPU kernel
    takes every float dtype: for other dtypes on meta, an op that allocates what the kernel does (the
    (tokens, out) result; backward: the input's and the weight's gradients) and saves nothing new."""
    import torch

    class GroupedMM(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, offs):
            ctx.save_for_backward(a, b)  # through autograd's hooks, so checkpointing can drop them
            return a.new_empty((a.shape[0], b.shape[-1]))

        @staticmethod
        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            return (grad.new_empty(a.shape) if ctx.needs_input_grad[0] else None,
                    grad.new_empty(b.shape) if ctx.needs_input_grad[1] else None, None)

    def call(mat_a, mat_b, *args, offs=None, **kwargs):
        if (mat_a.is_meta and mat_a.dtype != torch.bfloat16 and mat_a.dim() == 2 and mat_b.dim() == 3
                and not args and not kwargs):
            return GroupedMM.apply(mat_a, mat_b, offs)
        return grouped(mat_a, mat_b, *args, offs=offs, **kwargs)

    return call


@dataclass
class ActivationEstimate:
    seq_len: int
    micro_batch: int
    checkpointing: bool
    bytes: int  # peak of the step's tensors beyond parameters and their gradients
    # The terms of the formula shown to the user.
    layers: int = 0
    layer_class: str = ""
    per_layer: int = 0  # bytes one layer's forward leaves for backward (the largest layer)
    in_layers: int = 0  # the same, summed over the layers
    outside: int = 0  # kept outside the layers: embeddings, final norm, logits, loss
    backward: int = 0  # peak minus what the forward kept: gradients of activations, recompute
    other: Optional["ActivationEstimate"] = None  # the same step with checkpointing flipped
    compute_dtype: Optional[str] = None  # the mixed-precision param dtype the step ran in, if any

    @property
    def kept(self) -> int:
        return self.in_layers + self.outside

    @property
    def formula(self) -> str:
        from fsdplint.audit.memory import fmt_bytes

        tokens = self.micro_batch * self.seq_len
        text = (f"{self.micro_batch} x {self.seq_len} = {tokens:,} tokens"
                + (f" in {self.compute_dtype} (mixed precision)" if self.compute_dtype else "") + "; kept by the forward: "
                f"{fmt_bytes(self.in_layers)} from the {self.layers} {self.layer_class or 'layers'} "
                f"(largest {fmt_bytes(self.per_layer)}"
                + (", checkpointed: their outputs only" if self.checkpointing else "")
                + f") + {fmt_bytes(self.outside)} from outside them (embeddings, final norm, logits, loss); "
                f"+ {fmt_bytes(self.backward)} at the backward peak (activation gradients"
                + (", one layer recomputed" if self.checkpointing else "") + ")")
        if self.other is not None:
            text += (f"; {'without' if self.checkpointing else 'with'} activation checkpointing: "
                     f"{fmt_bytes(self.other.bytes)}")
        return text


def estimate_activations(model, layer_classes: list[str], *, seq_len: int, micro_batch: int,
                         checkpointing: bool) -> ActivationEstimate:
    """Peak activation bytes of one training step of `model` (unsharded, on meta), both ways."""
    est = _measure(model, layer_classes, seq_len, micro_batch, checkpointing)
    est.other = _measure(model, layer_classes, seq_len, micro_batch, not checkpointing)
    return est


def _checkpointing_on(base) -> bool:
    # transformers 5 renamed gradient checkpointing to activation checkpointing (old names warn).
    if getattr(type(base), "is_activation_checkpointing", None) is not None:
        return bool(base.is_activation_checkpointing)
    return bool(getattr(base, "is_gradient_checkpointing", False))


def _set_checkpointing(base, on: bool) -> None:
    """transformers' own switch: non-reentrant `torch.utils.checkpoint` around every decoder layer."""
    if hasattr(base, "activation_checkpointing_enable"):
        if on:
            base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            base.activation_checkpointing_disable()
    elif on:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        base.gradient_checkpointing_disable()


def _measure(model, layer_classes, seq_len, micro_batch, checkpointing) -> ActivationEstimate:
    import torch

    wanted = set(layer_classes)
    layers = [m for _, m in model.named_modules() if type(m).__name__ in wanted]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    gc_on = _checkpointing_on(base)
    ids = torch.zeros(micro_batch, seq_len, dtype=torch.long, device="meta")
    windows: dict = {}  # layer index -> [first op, last op] of its forward
    state: dict = {"trace": None, "forward": False}
    hooks = []
    for i, layer in enumerate(layers):
        def pre(mod, args, i=i):
            if state["forward"]:
                windows.setdefault(i, [state["trace"].ops, None])

        def post(mod, args, out, i=i):
            if state["forward"] and i in windows and windows[i][1] is None:
                windows[i][1] = state["trace"].ops

        hooks.append(layer.register_forward_pre_hook(pre))
        hooks.append(layer.register_forward_hook(post))

    def run(trace):
        state["trace"], state["forward"] = trace, True
        # Only the loss outlives the forward (as in transformers' Trainer): the logits are freed
        # before the backward unless a script keeps the model output alive.
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        state["forward"] = False
        trace.forward_ops = trace.ops
        loss.backward()

    was_training = model.training
    try:
        model.train()
        if checkpointing != gc_on:
            _set_checkpointing(base, checkpointing)
        trace, grads = trace_step(run, grads_of=model)
    finally:
        for h in hooks:
            h.remove()
        if checkpointing != gc_on:
            _set_checkpointing(base, gc_on)
        model.train(was_training)
        for p in model.parameters():
            p.grad = None
    end = trace.forward_ops
    alive = [(n, b) for i, (n, b, d) in enumerate(trace.records)
             if i not in grads and b <= end and (d is None or d > end)]
    kept_by = [sum(n for n, b in alive if lo < b <= hi) for lo, hi in windows.values() if hi is not None]
    kept = sum(n for n, _ in alive)
    peak = trace.peak(exclude=grads)
    return ActivationEstimate(
        seq_len=seq_len, micro_batch=micro_batch, checkpointing=checkpointing, bytes=peak,
        layers=len(layers), layer_class=type(layers[0]).__name__ if layers else "",
        per_layer=max(kept_by, default=0), in_layers=sum(kept_by), outside=kept - sum(kept_by),
        backward=peak - kept)
