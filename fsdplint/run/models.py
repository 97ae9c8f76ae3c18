"""`from_pretrained` in the dry-run world: the model from its config.json on the meta device, no weights.

The config is read by transformers itself (a local directory or the hub cache, as the job names it),
the architecture class is the one the job asked for, and a `BitsAndBytesConfig` goes through
transformers' real bitsandbytes quantizer, as in `fsdplint model`. A 4-bit weight then gets what the
real load leaves in it: its packed storage, `(numel/2, 1)` elements of `bnb_4bit_quant_storage`
(uint8 unless the job says otherwise), which is what FSDP flattens.
"""

from __future__ import annotations

NOTES: list[str] = []


def install() -> None:
    from transformers import PreTrainedModel

    original = PreTrainedModel.from_pretrained.__func__

    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        return build(cls, pretrained_model_name_or_path, original, *args, **kwargs)

    PreTrainedModel.from_pretrained = classmethod(from_pretrained)


def _dtype(kwargs, config):
    import torch

    d = kwargs.get("dtype", kwargs.get("torch_dtype"))
    if d == "auto" or d is None:
        d = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) if d == "auto" else None
    if isinstance(d, str):
        d = getattr(torch, d.replace("torch.", ""), None)
    return d if isinstance(d, torch.dtype) else torch.float32


def build(cls, name, original, *args, **kwargs):
    import torch
    from transformers import AutoConfig

    config = kwargs.pop("config", None)
    if config is None or isinstance(config, str):
        config = AutoConfig.from_pretrained(config or name, trust_remote_code=kwargs.get("trust_remote_code", False),
                                            revision=kwargs.get("revision"))
    quant = kwargs.get("quantization_config")
    if quant is None and (kwargs.get("load_in_4bit") or kwargs.get("load_in_8bit")):
        from transformers import BitsAndBytesConfig

        quant = BitsAndBytesConfig(load_in_4bit=bool(kwargs.get("load_in_4bit")),
                                   load_in_8bit=bool(kwargs.get("load_in_8bit")))
    if isinstance(quant, dict):
        from transformers import BitsAndBytesConfig

        quant = BitsAndBytesConfig.from_dict(quant)
    dtype = _dtype(kwargs, config)
    for attr, value in kwargs.items():  # from_pretrained(..., use_cache=False, attn_implementation=...)
        if attr in ("attn_implementation",) and value is not None:
            config._attn_implementation = value
        elif hasattr(config, attr) and attr not in ("dtype", "torch_dtype"):
            setattr(config, attr, value)
    with torch.device("meta"):
        model = cls._from_config(config, dtype=dtype)
    if quant is not None and type(quant).__name__ == "BitsAndBytesConfig":
        _quantize(model, quant, dtype)
    model.eval()  # from_pretrained returns the model in eval mode
    NOTES.append(f"{type(model).__name__} built from {name}'s config.json on meta (no weights)"
                 + (f", {'4' if quant.load_in_4bit else '8'}-bit via the bitsandbytes quantizer" if quant is not None else ""))
    return model


def _quantize(model, quant, dtype) -> None:
    import torch

    from fsdplint.audit.build import quantize_as_from_pretrained

    quantizer = quantize_as_from_pretrained(model, quant, dtype)
    if quant.load_in_4bit:
        _packed_4bit(model, quant.bnb_4bit_quant_storage or torch.uint8)
    model.hf_quantizer = quantizer
    model.is_loaded_in_4bit = bool(quant.load_in_4bit)
    model.is_loaded_in_8bit = bool(quant.load_in_8bit)


def _packed_4bit(model, storage) -> None:
    """Each 4-bit weight as the real load leaves it: packed, in the storage dtype (bitsandbytes
    `quantize_4bit` packs two 4-bit values per byte; a wider storage dtype holds more per element)."""
    import torch
    import bitsandbytes as bnb

    per_element = torch.empty((), dtype=storage).element_size() * 2  # 4-bit values per element
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            w = module.weight
            n = (w.numel() + per_element - 1) // per_element
            packed = bnb.nn.Params4bit(torch.empty((n, 1), dtype=storage, device="meta"), requires_grad=False,
                                       quant_storage=storage, bnb_quantized=True, quant_type=w.quant_type,
                                       blocksize=w.blocksize, compress_statistics=w.compress_statistics)
            module.weight = packed
