"""The dry run's emulation of CUDA autocast on CPU tensors (fsdplint.run.autocast): the dtypes each op
gives under `torch.autocast("cuda")` on a GPU, per torch's CUDA autocast op reference, in the forms
jobs call them (torch functions, Tensor methods and operators, torch.nn.functional, modules)."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from fsdplint.run import autocast  # noqa: E402

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


@contextlib.contextmanager
def region(dtype=BF16):
    """A CUDA autocast region as `torch.autocast("cuda")` opens it on a GPU node."""
    prev = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", prev[0])
        torch.set_autocast_dtype("cuda", prev[1])


@contextlib.contextmanager
def cuda_autocast(dtype=BF16, on_unemulated=None):
    """The region with the emulation on (the dry run keeps it on for the whole job)."""
    with autocast.mode(on_unemulated), region(dtype):
        yield


def r(*shape, dtype=FP32, grad=False):
    return torch.randn(*shape, dtype=dtype, requires_grad=grad)


LOWER_CALLS = {
    "torch.mm": lambda a, b: torch.mm(a, b),
    "a @ b": lambda a, b: a @ b,
    "Tensor.matmul": lambda a, b: a.matmul(b),
    "F.linear": lambda a, b: F.linear(a, b),
    "nn.Linear": lambda a, b: torch.nn.Linear(4, 4)(a),
    "torch.einsum": lambda a, b: torch.einsum("ij,jk->ik", a, b),
    "torch.baddbmm": lambda a, b: torch.baddbmm(a[None], a[None], b[None]),
    "torch.linalg.multi_dot": lambda a, b: torch.linalg.multi_dot([a, b, a]),
    "F.scaled_dot_product_attention": lambda a, b: F.scaled_dot_product_attention(a[None], b[None], b[None]),
    "torch.ops.aten.mm": lambda a, b: torch.ops.aten.mm.default(a, b),
}


@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.parametrize("call", sorted(LOWER_CALLS))
def test_matmuls_and_linears_run_in_the_autocast_dtype(call, dtype):
    with cuda_autocast(dtype):
        out = LOWER_CALLS[call](r(4, 4), r(4, 4).to(BF16 if dtype == FP16 else FP16))
    assert out.dtype == dtype


FP32_CALLS = {
    "F.softmax": lambda x: F.softmax(x, dim=-1),
    "Tensor.softmax": lambda x: x.softmax(-1),
    "torch.log_softmax": lambda x: torch.log_softmax(x, -1),
    "F.cross_entropy": lambda x: F.cross_entropy(x, torch.tensor([0, 1, 2, 3])),
    "F.layer_norm": lambda x: F.layer_norm(x, (4,)),
    "nn.LayerNorm": lambda x: torch.nn.LayerNorm(4, dtype=BF16)(x),
    "F.rms_norm": lambda x: F.rms_norm(x, (4,)),
    "Tensor.exp": lambda x: x.exp(),
    "torch.rsqrt": lambda x: torch.rsqrt(x.abs() + 1),
    "x ** 2": lambda x: x ** 2,
    "1 / x": lambda x: 1 / x,
    "Tensor.sum": lambda x: x.sum(),
    "torch.cumsum": lambda x: torch.cumsum(x, 0),
    "F.mse_loss": lambda x: F.mse_loss(x, x.detach()),
    "torch.norm": lambda x: torch.norm(x),
}


@pytest.mark.parametrize("call", sorted(FP32_CALLS))
def test_softmax_norms_losses_and_reductions_run_in_float32(call):
    with cuda_autocast(BF16):
        out = FP32_CALLS[call](r(4, 4, dtype=BF16))
    assert out.dtype == FP32


def test_unlisted_ops_keep_their_inputs_types_and_promotion():
    a, b = r(4, 4, dtype=BF16), r(4, 4)
    with cuda_autocast(BF16):
        assert (a + b).dtype == FP32  # built-in type promotion, as on a GPU
        assert F.silu(a).dtype == BF16 and a.transpose(0, 1).dtype == BF16
        assert torch.addcmul(a, a, b).dtype == FP32  # "promote" ops: the widest input
        assert torch.addcmul(a, a, a.to(FP16)).dtype == BF16


def test_what_autocast_leaves_alone_is_left_alone():
    a = r(4, 4)
    with cuda_autocast(BF16):
        assert torch.mm(a.double(), a.double()).dtype == torch.float64  # float64 is not eligible
        assert a.to(BF16).sum(dtype=BF16).dtype == BF16  # an explicit dtype is kept
        assert torch.arange(4).sum().dtype == torch.int64  # integer tensors are not eligible
        out = torch.empty(4, 4)
        torch.mm(a, a, out=out)  # out= calls do not autocast
        assert out.dtype == FP32
        x = a.to(BF16)
        x.exp_()  # in-place ops do not autocast
        assert x.dtype == BF16
    assert torch.mm(a, a).dtype == FP32  # outside the region: nothing cast
    with cuda_autocast(BF16):
        with torch.autocast("cuda", enabled=False):
            assert torch.mm(a, a).dtype == FP32


def test_backward_gives_each_parameter_a_gradient_of_its_own_dtype():
    lin = torch.nn.Linear(4, 4)  # float32 weights, bf16 compute
    with cuda_autocast(BF16):
        h = lin(r(2, 4))
        loss = F.cross_entropy(h, torch.tensor([0, 1]))
    assert h.dtype == BF16 and loss.dtype == FP32
    loss.backward()
    assert lin.weight.grad.dtype == FP32 and lin.bias.grad.dtype == FP32


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recomputation_reenters_the_same_casts(reentrant, monkeypatch):
    import torch.utils.checkpoint as cp

    # As on the dry run's fake GPU node: CUDA answers present, checkpointing's device type "cuda".
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    from torch.autograd.function import BackwardCFunction

    for name in ("apply", "apply_boxed"):  # restored after the test (autocast._in_backward wraps them)
        monkeypatch.setattr(BackwardCFunction, name, getattr(BackwardCFunction, name))
    monkeypatch.setattr(torch._C._autograd, "_push_saved_tensors_default_hooks",
                        torch._C._autograd._push_saved_tensors_default_hooks)
    prev = cp.DefaultDeviceType._default_device_type
    cp.DefaultDeviceType.set_device_type("cuda")
    try:
        lin = torch.nn.Linear(4, 4)
        x = r(2, 4, grad=True)
        seen = []

        def layer(t):
            h = lin(t)
            seen.append(h.dtype)
            return F.softmax(h, -1)

        with autocast.mode() as m:
            autocast._in_backward(m)
            with region(BF16):
                out = cp.checkpoint(layer, x, use_reentrant=reentrant)
            assert out.dtype == FP32
            out.sum().backward()  # outside the region: the recomputation re-enters it
        assert seen == [BF16, BF16]  # the forward and its recomputation (no metadata mismatch)
        assert lin.weight.grad is not None and lin.weight.grad.dtype == FP32
    finally:
        cp.DefaultDeviceType._default_device_type = prev


def test_binary_cross_entropy_raises_what_cuda_autocast_raises():
    with cuda_autocast(BF16), pytest.raises(RuntimeError, match="unsafe to autocast"):
        F.binary_cross_entropy(torch.sigmoid(r(4)), torch.rand(4))


def test_a_python_composite_of_listed_ops_is_reported_as_not_emulated():
    reasons = []
    attn = torch.nn.MultiheadAttention(8, 2)
    with cuda_autocast(BF16, on_unemulated=reasons.append):
        attn(r(3, 1, 8), r(3, 1, 8), r(3, 1, 8))
    assert reasons and "multi_head_attention_forward" in reasons[0]
    reasons.clear()
    with cuda_autocast(BF16, on_unemulated=reasons.append):
        F.dropout(r(4, 4), 0.1)
        F.embedding(torch.tensor([1]), r(4, 4))
    assert reasons == []  # Python-level functions that call no listed op are emulated exactly


def test_bitsandbytes_4bit_linear_computes_in_its_compute_dtype_as_on_a_gpu():
    # bitsandbytes' 4-bit matmul is its own operator, which CUDA autocast does not cast: the input is
    # cast to bnb_4bit_compute_dtype by Linear4bit itself and the output returns in the input's dtype.
    bnb = pytest.importorskip("bitsandbytes")
    from torch.overrides import TorchFunctionMode

    seen = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if "gemm_4bit" in getattr(func, "__name__", ""):
                seen.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    for compute in (BF16, FP32):
        lin = bnb.nn.Linear4bit(64, 32, bias=False, compute_dtype=compute, quant_type="nf4",
                                quant_storage=BF16)
        lin.weight = bnb.nn.Params4bit(r(32, 64).to(BF16), requires_grad=False, quant_type="nf4",
                                       quant_storage=BF16, module=lin)._quantize("cpu")
        x = r(2, 5, 64, grad=True)
        seen.clear()
        with Spy(), cuda_autocast(BF16):
            y = lin(x)
        y.sum().backward()
        assert seen == [compute] and y.dtype == FP32 and x.grad.dtype == FP32


@pytest.mark.parametrize("dropout", ["F.dropout", "nn.Dropout", "torch.dropout"])
def test_non_reentrant_recomputation_accepts_dropout_over_another_input_dtype(dropout, monkeypatch):
    # On a GPU, dropout is the fused kernel and saves a bool mask, so the recomputation's saved tensors
    # match the forward's; the CPU composite saves its noise in the input's dtype and would not.
    import torch.utils.checkpoint as cp

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    from torch.autograd.function import BackwardCFunction

    for name in ("apply", "apply_boxed"):
        monkeypatch.setattr(BackwardCFunction, name, getattr(BackwardCFunction, name))
    monkeypatch.setattr(torch._C._autograd, "_push_saved_tensors_default_hooks",
                        torch._C._autograd._push_saved_tensors_default_hooks)
    drop = {"F.dropout": lambda t: F.dropout(t, 0.1, training=True),
            "nn.Dropout": torch.nn.Dropout(0.1).train(),
            "torch.dropout": lambda t: torch.dropout(t, 0.1, True)}[dropout]
    # A LoRA layer under FSDP1 mixed precision with `use_orig_params=False`: its weight is the float32
    # parameter until the unit's first forward, then the bfloat16 unsharded view, so the recomputation
    # casts its input (`x.to(lora_A.weight.dtype)`) to another dtype than the forward did.
    layer = torch.nn.Module()
    layer.weight, layer.calls = torch.nn.Parameter(torch.randn(4, 4)), 0

    def block(t):
        w = layer.weight if layer.calls == 0 else layer.weight.to(BF16)
        layer.calls += 1
        return F.softmax(F.linear(drop(t.to(w.dtype)), w), -1)

    prev = cp.DefaultDeviceType._default_device_type
    cp.DefaultDeviceType.set_device_type("cuda")
    try:
        with autocast.mode() as m:
            autocast._in_backward(m)
            with region(BF16):
                out = cp.checkpoint(block, r(2, 4, grad=True), use_reentrant=False)
            out.sum().backward()  # raised "Recomputed values ... have different metadata" on the CPU graph
        assert layer.calls == 2 and layer.weight.grad is not None
    finally:
        cp.DefaultDeviceType._default_device_type = prev


def test_dropout_keeps_its_semantics_where_cuda_keeps_the_composite():
    x = r(64, 64)
    with cuda_autocast(BF16):
        assert torch.equal(F.dropout(x, 0.5, training=False), x)  # eval: identity
        assert torch.equal(F.dropout(x, 0.0, training=True), x)
        assert torch.count_nonzero(F.dropout(x, 1.0, training=True)) == 0
        y = F.dropout(x, 0.5, training=True)
        kept = y != 0
        assert torch.allclose(y[kept], x[kept] * 2)  # kept elements scaled by 1 / (1 - p)
        assert 0.3 < kept.float().mean() < 0.7
        z = x.clone()
        F.dropout(z, 0.5, training=True, inplace=True)
        assert (z == 0).any()
        with pytest.raises(ValueError):
            F.dropout(x, 1.5)


class _HalfProductKernels(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the dtypes of the matrix-product kernels that actually run."""

    def __init__(self):
        super().__init__()
        self.dtypes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ("mm", "bmm", "addmm", "baddbmm"):
            self.dtypes.append(args[0].dtype)
        return func(*args, **(kwargs or {}))


_BF16_LINEAR = torch.nn.Linear(4, 4, dtype=BF16)
HALF_PRODUCTS = {
    "a @ b (a bf16 model, no autocast)": (None, lambda a, b: a.to(BF16) @ b.to(BF16)),
    "nn.Linear in bf16 (no autocast)": (None, lambda a, b: _BF16_LINEAR(a.to(BF16))),
    "F.linear under bf16 autocast": (BF16, lambda a, b: F.linear(a, b)),
    "torch.bmm under fp16 autocast": (FP16, lambda a, b: torch.bmm(a[None], b[None])),
}


@pytest.mark.parametrize("call", sorted(HALF_PRODUCTS))
def test_half_precision_products_run_the_float32_kernel_and_keep_the_gpus_dtypes(call):
    # The CPU's bfloat16/float16 product kernels are an order of magnitude slower than float32's on CPUs
    # without half-precision units: the dry run multiplies in float32 and rounds, as a GPU accumulates.
    dtype, fn = HALF_PRODUCTS[call]
    a, b = r(3, 4, grad=True), r(4, 4, grad=True)
    kernels = _HalfProductKernels()
    with (cuda_autocast(dtype) if dtype else autocast.mode()), kernels:
        out = fn(a, b)
        out.float().sum().backward()
    want = dtype or BF16
    assert out.dtype == want
    assert kernels.dtypes and set(kernels.dtypes) == {FP32}, kernels.dtypes
    assert a.grad is not None and a.grad.dtype == FP32
    # The values are the half-precision inputs' product, rounded once.
    with torch.no_grad():
        ref = fn(a.detach(), b.detach()) if dtype is None else None
    if ref is not None:
        assert torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_float32_and_subclass_products_run_as_called():
    a, b = r(3, 4), r(4, 4)
    kernels = _HalfProductKernels()
    with autocast.mode(), kernels:
        assert (a @ b).dtype == FP32
        meta = torch.empty(3, 4, dtype=BF16, device="meta") @ torch.empty(4, 4, dtype=BF16, device="meta")
    assert meta.dtype == BF16 and meta.device.type == "meta"
    assert kernels.dtypes == [FP32, BF16]
