"""`from_pretrained` in the dry-run world: the model from its config.json, no weights.

What the job gets is the shrunk twin (`twin`): the same architecture class at reduced sizes, on the
CPU with random values, quantized for real, so its forward, backward and optimizer step run. The
real config, dtype and quantization are recorded in REAL: the memory table is computed from them
(`fullsize`), never from the twin. When the twin cannot be built (an architecture whose config the
shrink does not fit), the job gets the real-size model on meta, as before, and stops at its first
forward, said so in the notes.

The config is read by transformers itself (a local directory or the hub cache, as the job names it),
the architecture class is the one the job asked for, and a `BitsAndBytesConfig` goes through
transformers' real bitsandbytes quantizer, as in `fsdplint model`. A 4-bit weight then gets what the
real load leaves in it: its packed storage, `(numel/2, 1)` elements of `bnb_4bit_quant_storage`
(uint8 unless the job says otherwise), which is what FSDP flattens.
"""

from __future__ import annotations

NOTES: list[str] = []
# One entry per from_pretrained call: what the real load would build (for the memory table).
REAL: list[dict] = []
META_BUILT: list[str] = []  # classes built as the real-size meta model (no twin fits their config)
WORLD = {"size": 1}


def install(world_size: int = 1) -> None:
    WORLD["size"] = world_size
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
    bnb = quant if quant is not None and type(quant).__name__ == "BitsAndBytesConfig" else None
    if str(getattr(config, "_attn_implementation", None) or "").startswith("flash"):
        # flash-attn kernels need a GPU; sdpa computes the same attention on the CPU.
        config._attn_implementation = "sdpa"
        NOTES.append("attn_implementation flash_attention_*: the twin computes attention with sdpa on the CPU")
    from fsdplint.run import twin

    bits = f", {'4' if bnb.load_in_4bit else '8'}-bit via the bitsandbytes quantizer" if bnb is not None else ""
    REAL.append({"config": config.to_dict(), "cls": cls.__name__, "dtype": str(dtype).replace("torch.", ""),
                 "quantization": _jsonable(bnb.to_dict()) if bnb is not None else None, "name": str(name)})
    try:
        small = twin.shrink(config, WORLD["size"])
        model = twin.build(cls, small, dtype, bnb)
        NOTES.append(f"{type(model).__name__} from {name}'s config.json: trained as a shrunk twin on the CPU "
                     f"({twin.sizes(small)}; random values){bits}; memory figures are the real config's")
    except Exception as e:  # noqa: BLE001 - the real-size meta model still lets the job reach its wrap
        with torch.device("meta"):
            model = cls._from_config(config, dtype=dtype)
        if bnb is not None:
            _quantize(model, bnb, dtype)
        for p in model.parameters():  # the wraps and the stop point tell it from a job's own meta model
            p._fsdplint_meta_model = True
        META_BUILT.append(cls.__name__)
        NOTES.append(f"{type(model).__name__} built from {name}'s config.json on meta (no weights){bits}; no "
                     f"shrunk twin ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}), so the "
                     f"run stops at the first training forward")
    model.eval()  # from_pretrained returns the model in eval mode
    return model


def _jsonable(d: dict) -> dict:
    return {k: (str(v).replace("torch.", "") if type(v).__name__ == "dtype" else v) for k, v in d.items()
            if isinstance(v, (str, int, float, bool, list, type(None))) or type(v).__name__ == "dtype"}


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
