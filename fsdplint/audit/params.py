"""What the audit knows about each parameter, recorded before FSDP touches the model."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(eq=False)
class ParamInfo:
    fqn: str
    # Other names of the same tensor (tied / shared parameters).
    aliases: list[str]
    # Modules that hold it: (module fqn, attribute name).
    owners: list[tuple[str, str]]
    shape: tuple
    numel: int
    dtype: Any  # torch.dtype as built on meta
    requires_grad: bool
    kind: str = ""  # "4bit" | "8bit" | ""
    # What FSDP would really see once weights are loaded: 4-bit packs two values per byte
    # into `quant_storage` elements.
    storage_dtype: Any = None
    storage_numel: int = 0
    expert: bool = False  # a bare/3-D MoE expert parameter (not a Linear/Embedding weight)
    lora_reached: bool = False  # wrapped by a peft ParamWrapper (target_parameters)
    ignored: bool = False
    # LoRA adapter params: (dtype before peft's fp32 autocast, where it came from); None otherwise.
    adapter_dtype: Any = None
    obj: Any = field(default=None, repr=False)
    # 4-bit only: bytes of the bnb QuantState (absmax, code; nested: offset and the second state)
    # a loaded weight carries next to its packed data.
    quant_state_bytes: int = 0

    @property
    def itemsize(self) -> int:
        return self.storage_dtype.itemsize

    @property
    def storage_bytes(self) -> int:
        return self.storage_numel * self.storage_dtype.itemsize


def dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def collect_params(model, built) -> list[ParamInfo]:
    """One ParamInfo per distinct parameter tensor, in `model.parameters()` order."""
    import torch

    by_id: dict[int, ParamInfo] = {}
    reached = _param_wrapper_targets(model)
    module_names = {}
    for mname, mod in model.named_modules(remove_duplicate=False):
        module_names.setdefault(id(mod), mname)
        for pname, p in mod._parameters.items():
            if p is None:
                continue
            fqn = f"{mname}.{pname}" if mname else pname
            info = by_id.get(id(p))
            if info is None:
                kind = {"Params4bit": "4bit", "Int8Params": "8bit"}.get(type(p).__name__, "")
                storage_dtype, storage_numel = p.dtype, p.numel()
                if kind == "4bit":
                    storage_dtype = getattr(p, "quant_storage", None) or torch.uint8
                    # Two 4-bit values per byte, packed into quant_storage elements.
                    storage_numel = -(-p.numel() // (2 * storage_dtype.itemsize))
                elif kind == "8bit":
                    storage_dtype = torch.int8
                info = ParamInfo(
                    fqn=fqn, aliases=[], owners=[], shape=tuple(p.shape), numel=p.numel(), dtype=p.dtype,
                    requires_grad=p.requires_grad, kind=kind, storage_dtype=storage_dtype,
                    storage_numel=storage_numel, expert=_is_expert(mname, mod, p), obj=p,
                    lora_reached=id(p) in reached, adapter_dtype=getattr(built, "adapter_dtypes", {}).get(fqn),
                )
                if kind == "4bit":
                    info.quant_state_bytes = quant_state_bytes(p)
                by_id[id(p)] = info
            elif fqn != info.fqn and fqn not in info.aliases:
                info.aliases.append(fqn)
            if (mname, pname) not in info.owners:
                info.owners.append((mname, pname))
    # `parameters()` order is the order FSDP flattens in.
    order = {id(p): i for i, p in enumerate(model.parameters())}
    return sorted(by_id.values(), key=lambda i: order.get(id(i.obj), len(order)))


_QUANT_STATE_CACHE: dict = {}


def quant_state_bytes(p) -> int:
    """Bytes of the QuantState bitsandbytes creates when it quantizes the (meta) Params4bit `p`.

    bnb's own `quantize_4bit` runs on a meta tensor of the weight's shape with the parameter's
    blocksize, quant type, storage and double quantization, and the tensors of the state it returns
    are summed: one float32 absmax per block and a copy of the 16-value code; with
    `compress_statistics` (bnb_4bit_use_double_quant) uint8 absmax, a float32 offset and a nested
    state (float32 absmax per 256 blocks, a copy of the 256-value dynamic code).
    """
    import torch

    shape = tuple(p.shape)
    if getattr(p, "bnb_quantized", False) and getattr(p, "quant_state", None) is not None:
        shape = tuple(p.quant_state.shape)
    key = (shape, p.dtype, getattr(p, "blocksize", 64), bool(getattr(p, "compress_statistics", False)),
           getattr(p, "quant_type", "fp4"), getattr(p, "quant_storage", torch.uint8))
    if key not in _QUANT_STATE_CACHE:
        import bitsandbytes.functional as bnbf

        dtype = p.dtype if p.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.bfloat16
        saved = dict(bnbf.name2qmap)  # bnb caches its dynamic map per device: keep meta out of it
        try:
            _, state = bnbf.quantize_4bit(torch.empty(shape, dtype=dtype, device="meta"), blocksize=key[2],
                                          compress_statistics=key[3], quant_type=key[4], quant_storage=key[5])
        finally:
            bnbf.name2qmap.clear()
            bnbf.name2qmap.update(saved)
        _QUANT_STATE_CACHE[key] = sum(t.numel() * t.element_size() for t in _state_tensors(state))
    return _QUANT_STATE_CACHE[key]


def _state_tensors(state) -> list:
    """The distinct tensors of a bnb QuantState, nested state included."""
    import torch

    out, seen = [], set()
    while state is not None:
        for t in (state.absmax, state.code, state.offset):
            if isinstance(t, torch.Tensor) and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        state = state.state2
    return out


def _is_expert(mname: str, mod, p) -> bool:
    import torch.nn as nn

    if isinstance(mod, (nn.ParameterList, nn.ParameterDict)):
        return True
    if p.dim() >= 3 and "expert" in mname.lower():
        return True
    return False


def _param_wrapper_targets(model) -> set[int]:
    """ids of parameters that peft `target_parameters` (ParamWrapper) put LoRA on."""
    try:
        from peft.tuners.lora.layer import ParamWrapper
    except ImportError:  # older peft: no target_parameters at all
        return set()
    out = set()
    for mod in model.modules():
        if isinstance(mod, ParamWrapper):
            base = mod.get_base_layer()
            p = getattr(base, mod.parameter_name, None)
            if p is not None:
                out.add(id(p))
    return out


def mark_ignored(params: list[ParamInfo], rule) -> list[ParamInfo]:
    """Apply the spec's `ignored_params` rule: "4bit" or name patterns."""
    if rule is None:
        return []
    out = []
    for info in params:
        if rule == "4bit":
            hit = info.kind == "4bit"
        else:
            names = [info.fqn, *info.aliases]
            hit = any(fnmatch.fnmatchcase(n, pat) or fnmatch.fnmatchcase(n, "*." + pat)
                      for n in names for pat in rule)
        if hit:
            info.ignored = True
            out.append(info)
    return out
