"""CUDA autocast as a GPU applies it, for the twin's CPU tensors.

A job under mixed precision (accelerate's `mixed_precision: bf16`, Trainer's `bf16=True`, a loop's
`torch.autocast("cuda", dtype=torch.bfloat16)`) autocasts on "cuda". The twin computes on the CPU,
and CUDA autocast casts only CUDA tensors, so without help the forward would meet dtype mixes a GPU
never sees (`expected m1 and m2 to have the same dtype`). Autocasting on the CPU instead is not the
same run: the CPU's op lists differ (softmax and layer_norm stay in bf16 there), and checkpoint
recomputation records and re-enters autocast per device type.

So the job's autocast state stays "cuda", and one torch-function mode, active for the whole run,
applies CUDA autocast's op policy to the calls made while `torch.is_autocast_enabled("cuda")` is
true, with `torch.get_autocast_dtype("cuda")`. A torch-function mode sits above autograd, as the
autocast dispatch key does, so its casts are recorded and backward sees the dtypes a GPU run has.
torch.utils.checkpoint records the "cuda" autocast state at the forward (with no CUDA tensor about,
its device type is the node's accelerator, "cuda" on the fake node) and re-enters it for the
recomputation, where the mode applies the same casts.

The same mode gives `dropout` CUDA's fused kernel (see `_dropout_as_on_cuda`): what it saves for
backward is what a GPU saves, which checkpointing compares at the recomputation.

What a torch-function mode cannot see is the inside of a torch function: a C++ composite (cross
entropy = log_softmax + nll_loss) is seen whole, which is why the policy is keyed on the names
torch's autocast reference documents at the Python level (`cross_entropy`, `__rdiv__`, ...), and a
torch function written in Python (`multi_head_attention_forward`, `interpolate`) runs whole, its
inner listed ops uncast. Such a function under autocast, or a CPU kernel missing for the autocast
dtype, ends the run at that point (see `sentinel.autocast_unemulated`), as a meta run stops at its
forward, and the report says which: the run never reports a dtype error a GPU would not raise.
"""

from __future__ import annotations

import functools
import inspect
import re

# The op lists of CUDA autocast. Sources: torch's "Autocast Op Reference" (docs/source/amp.rst:
# "CUDA Ops that can autocast to float16 / to float32 / that promote to the widest input type",
# names at the Python level), aten/src/ATen/autocast_mode.h (AT_FORALL_LOWER_PRECISION_FP,
# AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_PROMOTE, registered for AutocastCUDA in
# autocast_mode.cpp, with binary_cross_entropy banned), and torch's own CUDA autocast test lists
# (torch/testing/_internal/autocast_test_lists.py, AutocastTestLists: rms_norm and vdot there too).
LOWER = frozenset("""
    _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d convolution
    cudnn_convolution cudnn_convolution_transpose prelu addmm addmv addr matmul __matmul__ __rmatmul__ einsum
    mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot multi_dot
    _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
    _scaled_dot_product_flash_attention scaled_dot_product_attention
""".split())
FP32 = frozenset("""
    acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow __pow__ __rpow__
    __rdiv__ __rtruediv__ softplus layer_norm native_layer_norm group_norm rms_norm frobenius_norm nuclear_norm
    cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div
    l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss
    triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp
    cross_entropy normalize softmin norm
    upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d _upsample_nearest_exact2d upsample_nearest3d
    _upsample_nearest_exact3d upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d
    upsample_bicubic2d _upsample_bicubic2d_aa
""".split())
# Run in float32 by passing dtype=float32 when the call gives none and its first argument is eligible
# (an explicit dtype is kept).
FP32_SET_OPT_DTYPE = frozenset("""
    prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum
""".split())
PROMOTE = frozenset("""
    addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler grid_sample index_put tensordot scatter_add
""".split())
BANNED = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
        "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
        "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
        "safe to autocast."),
}
LISTED = LOWER | FP32 | FP32_SET_OPT_DTYPE | PROMOTE | frozenset(BANNED)
_MISSING_KERNEL = re.compile(r"not implemented for '(Half|BFloat16|Float8\w*)'")

STATE = {"installed": False, "used": None}  # used: the autocast dtype of the first call the mode cast


def install(on_unemulated=None, on_first_use=None) -> None:
    """Enter the mode for the rest of the process (see `mode`)."""
    m = mode(on_unemulated, on_first_use)
    if m is None:
        return
    import torch.utils.checkpoint as checkpoint

    # What checkpointing records and re-enters for a recomputation over CPU tensors is the autocast
    # state of its default device type: the node's accelerator, "cuda" as on a GPU node (set here, not
    # left to whichever call first asks for it).
    checkpoint.DefaultDeviceType.set_device_type("cuda")
    m.__enter__()
    _in_backward(m, on_unemulated)
    STATE["installed"] = True


def _in_backward(m, on_unemulated=None) -> None:
    """torch's autograd engine runs the Python parts of a backward (a custom Function's backward, a
    saved-tensor unpack hook, in which non-reentrant checkpointing recomputes its forward) without
    the thread's torch-function modes. A recomputation re-enters the CUDA autocast state its forward
    had, and on a GPU its casts apply again: the mode is re-entered around those callbacks, so the
    recomputed tensors have the dtypes of the forward (checkpointing compares them)."""
    import torch
    from torch.autograd.function import BackwardCFunction
    from torch.overrides import _get_current_function_mode_stack

    def with_mode(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            if any(x is m for x in _get_current_function_mode_stack()):
                return fn(*args, **kwargs)
            try:
                with m:
                    return fn(*args, **kwargs)
            except Exception as e:
                # A recomputation whose dtypes differ from its forward's under the emulation (a path
                # not covered yet) is the dry run's limit, not the job's error: stop, and say so.
                if STATE["used"] is not None and on_unemulated is not None \
                        and "different metadata than during the forward" in str(e):
                    on_unemulated("checkpointing's recomputation did not get its forward's dtypes under the "
                                  "emulation (" + str(e).splitlines()[0][:160] + ")")
                raise

        return run

    for name in ("apply", "apply_boxed"):
        if hasattr(BackwardCFunction, name):
            setattr(BackwardCFunction, name, with_mode(getattr(BackwardCFunction, name)))
    autograd = torch._C._autograd
    push = autograd._push_saved_tensors_default_hooks

    def push_hooks(pack_hook, unpack_hook):
        return push(pack_hook, with_mode(unpack_hook))

    autograd._push_saved_tensors_default_hooks = push_hooks


def mode(on_unemulated=None, on_first_use=None):
    """The torch-function mode. `on_unemulated(reason)` is called (and may raise to stop the run)
    where it cannot give a GPU's dtypes; `on_first_use(dtype)` once, at the first listed call made
    under CUDA autocast. None on a torch without the per-device autocast API."""
    import torch
    from torch.overrides import TorchFunctionMode

    if not hasattr(torch, "get_autocast_dtype"):
        return None

    class CudaAutocastOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.nn.functional.dropout or func is torch.dropout:
                return _dropout_as_on_cuda(torch, func, args, kwargs)
            if not torch.is_autocast_enabled("cuda"):
                if _name(func) in MATMULS:
                    return _matmul_in_float32(torch, func, args, kwargs)
                return func(*args, **kwargs)
            name = _name(func)
            dtype = torch.get_autocast_dtype("cuda")
            if STATE["used"] is None and name in LISTED:
                STATE["used"] = dtype
                if on_first_use is not None:
                    on_first_use(dtype)
            try:
                return _apply(torch, func, name, dtype, args, kwargs, on_unemulated)
            except (RuntimeError, NotImplementedError) as e:
                match = _MISSING_KERNEL.search(str(e))
                if match and on_unemulated is not None:
                    # The CPU lacks a kernel the GPU has: the dry run's limit, not the job's error.
                    on_unemulated(f"the CPU has no {match.group(1)} kernel for {name or func} "
                                  f"({str(e).splitlines()[0][:120]})")
                raise

    return CudaAutocastOnCpu()


def _apply(torch, func, name, dtype, args, kwargs, on_unemulated):
    if name is None or kwargs.get("out") is not None:  # explicit out= calls do not autocast
        return func(*args, **kwargs)
    if name in LOWER:
        args, kwargs = _cast(torch, args, dtype), _cast(torch, kwargs, dtype)
        if name in MATMULS:
            return _matmul_in_float32(torch, func, args, kwargs)
        return func(*args, **kwargs)
    if name in FP32:
        return func(*_cast(torch, args, torch.float32), **_cast(torch, kwargs, torch.float32))
    if name in FP32_SET_OPT_DTYPE:
        first = args[0] if args else kwargs.get("input")
        given = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args[1:])
        if _eligible(torch, first) and not given:
            kwargs = {**kwargs, "dtype": torch.float32}
        return func(*args, **kwargs)
    if name in PROMOTE:
        widest = dtype
        for t in _tensors(torch, (args, kwargs)):
            if _eligible(torch, t) and t.dtype == torch.float32:
                widest = torch.float32
        return func(*_cast(torch, args, widest), **_cast(torch, kwargs, widest))
    if name in BANNED:
        raise RuntimeError(BANNED[name])
    if on_unemulated is not None and _composite_of_listed(func):
        on_unemulated(f"{getattr(func, '__module__', 'torch')}.{name} is a Python composite of ops CUDA "
                      f"autocast casts, which the CPU emulation cannot reach inside")
    return func(*args, **kwargs)


# Matrix products the CPU computes far slower in bfloat16/float16 than in float32 (no half-precision
# units on most CPUs: a 16k x 64 by 64 x 32k bf16 product took 12x its float32 time here). A GPU
# multiplies half-precision inputs with float32 accumulation and rounds the result once, so computing
# the product of the (already rounded) inputs in float32 and rounding it to the input dtype gives the
# dtypes and shapes a GPU gives, and values as close to its own as the CPU's half kernel is.
MATMULS = frozenset("mm matmul __matmul__ __rmatmul__ bmm addmm baddbmm linear".split())


def _matmul_in_float32(torch, func, args, kwargs):
    """`func` on half-precision CPU tensors, computed in float32 and rounded back; autograd records the
    casts, so backward's products run in float32 too and its gradients keep the inputs' dtypes. Anything
    else (float32, mixed dtypes, another device, tensor subclasses such as DTensor or quantized weights,
    an out= argument) runs as called."""
    if kwargs.get("out") is not None:
        return func(*args, **kwargs)
    tensors = list(_tensors(torch, (args, kwargs)))
    if not tensors:
        return func(*args, **kwargs)
    dtype = tensors[0].dtype
    if dtype not in (torch.bfloat16, torch.float16) or any(
            type(t) not in (torch.Tensor, torch.nn.Parameter) or t.dtype != dtype or t.device.type != "cpu"
            for t in tensors):
        return func(*args, **kwargs)
    out = func(*_cast(torch, args, torch.float32), **_cast(torch, kwargs, torch.float32))
    return out.to(dtype) if isinstance(out, torch.Tensor) else out


def _dropout_as_on_cuda(torch, func, args, kwargs):
    """Dropout as a CUDA tensor gets it: the fused kernel, which saves a bool mask for backward.

    On the CPU, torch's `dropout` is the composite `input * noise`, and the noise it saves has the
    input's dtype. Where a checkpointed region's input dtype differs between the forward and its
    recomputation while the saved values agree, the CPU graph then saves a tensor of another dtype and
    torch.utils.checkpoint refuses the recomputation, which the GPU accepts. peft's LoRA layers do this
    under FSDP1 with mixed precision and `use_orig_params=False`: `lora_dropout(x.to(lora_A.weight.dtype))`
    sees float32 weights before the unit's first unshard and the low-precision ones when it recomputes.
    torch chooses the fused kernel for `0 < p < 1` in training on a non-empty CUDA tensor; the in-place
    form has no fused kernel on any device and keeps the composite."""
    if func is torch.dropout:
        names, defaults = ("input", "p", "train"), (None, 0.5, True)
    else:
        names, defaults = ("input", "p", "training", "inplace"), (None, 0.5, True, False)
    bound = dict(zip(names, defaults))
    bound.update(zip(names, args))
    bound.update(kwargs)
    x, p, train = bound["input"], bound["p"], bound[names[2]]
    fused = (train and not bound.get("inplace", False) and isinstance(x, torch.Tensor) and 0 < p < 1
             and x.numel() > 0 and not x.is_nested)
    if not fused:
        return func(*args, **kwargs)
    return torch.native_dropout(x, p, True)[0]


def _name(func):
    """The op name the lists use: a function's or method's name (`Tensor.__matmul__`, `F.linear`,
    `torch.sum`), or an aten operator overload's (`aten.mm.default`); None for other operators."""
    op_ns = getattr(func, "namespace", None)
    if op_ns is not None:  # torch.ops.<ns>.<op>[.<overload>]
        return func.__name__.split(".")[0] if op_ns == "aten" else None
    return getattr(func, "__name__", None)


def _eligible(torch, t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _cast(torch, value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if _eligible(torch, value) and value.dtype != dtype else value
    if isinstance(value, (list, tuple)) and any(isinstance(v, (torch.Tensor, list, tuple)) for v in value):
        cast = [_cast(torch, v, dtype) for v in value]
        return type(value)(*cast) if hasattr(value, "_fields") else type(value)(cast)
    if isinstance(value, dict):
        return {k: _cast(torch, v, dtype) for k, v in value.items()}
    return value


def _tensors(torch, value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(torch, v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(torch, v)


@functools.lru_cache(maxsize=None)
def _composite_of_listed(func) -> bool:
    """A torch function written in Python whose body calls an op of the lists: on a GPU its inner ops
    autocast; the mode sees only the outer call (`F.multi_head_attention_forward`, `F.interpolate`)."""
    if not inspect.isfunction(func) or not (func.__module__ or "").startswith("torch"):
        return False
    return bool(_code_names(func.__code__) & LISTED)


def _code_names(code) -> set:
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _code_names(const)
    return names
