"""Build the model on the meta device: transformers config or factory, bnb quantization, real peft LoRA."""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from fsdplint.audit.env import load_stack, quiet
from fsdplint.audit.spec import AuditInputError, AuditSpec


@dataclass
class TargetCoverage:
    """How many modules (or expert parameters) one LoRA target name reached."""

    target: str
    modules: int
    note: str = ""
    # Names (relative to the base model) of the LoRA layers this target created.
    names: list = field(default_factory=list)


@dataclass
class BuildProblem:
    """A peft/transformers error that becomes a finding rather than a crash."""

    code: str
    message: str
    field: Optional[str] = None


@dataclass
class Built:
    model: Any  # what FSDP wraps: the peft model when LoRA was applied
    base: Any  # the transformers (or factory) model
    dtype: Any
    architecture: str
    no_split_modules: list[str]
    quantized: Optional[str] = None  # "4bit" | "8bit"
    quant_storage: Any = None
    quant_config: Any = None
    lora_config: Any = None
    lora_applied: bool = False
    coverage: list[TargetCoverage] = field(default_factory=list)
    # The LoRA target names the user wrote (before peft's MoE remapping).
    user_targets: Any = None
    problems: list[BuildProblem] = field(default_factory=list)
    # peft's own count, for the summary and to cross-check ours.
    peft_trainable: Optional[int] = None
    # adapter param name -> (dtype before peft's fp32 autocast, where that dtype came from).
    adapter_dtypes: dict = field(default_factory=dict)


def build_model(spec: AuditSpec) -> Built:
    load_stack()
    import torch

    with quiet():
        base, arch = _construct(spec)
        dtype = next((p.dtype for p in base.parameters() if p.is_floating_point()), torch.float32)
        built = Built(model=base, base=base, dtype=dtype, architecture=arch,
                      no_split_modules=list(getattr(base, "_no_split_modules", None) or []))
        if spec.prequantized is not None:
            _note_prequantized(spec, built)
        if spec.quantization:
            _quantize(spec, built)
        if spec.lora is not None:
            _apply_lora(spec, built)
    return built


def torch_dtype(name: Optional[str]):
    import torch

    return getattr(torch, name) if name else None


# Errors transformers/torch raise for a config they cannot build (strict config dataclasses,
# layer constructors' asserts and arithmetic on impossible sizes).
_BUILD_ERRORS = (ValueError, KeyError, TypeError, AttributeError, RuntimeError, AssertionError,
                 ZeroDivisionError, IndexError, OverflowError)
# Fields whose transformers default would silently stand in for a value the config forgot.
_REQUIRED_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def _construct(spec: AuditSpec):
    import torch

    if spec.factory:
        return _from_factory(spec), spec.factory
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    cfg = dict(spec.config)
    archs = cfg.get("architectures") or []
    model_type = cfg.pop("model_type", None) or _model_type_for(archs, spec)
    dtype = torch_dtype(spec.dtype) or _config_dtype(cfg)
    if dtype is None and spec.prequantized is not None and spec.prequantized["quant_method"] == "mxfp4" \
            and not spec.quantization:
        dtype = torch.bfloat16  # Mxfp4Dequantize produces bf16 (transformers quantizers/quantizer_mxfp4.py)
    elif dtype is None:
        dtype = torch.float32
        spec.input_notes.append("config.json has no torch_dtype: audited in float32, transformers' default dtype; "
                                "pass --dtype bfloat16 for a bf16 checkpoint.")
    for k in ("torch_dtype", "dtype", "quantization_config", "transformers_version", "_name_or_path"):
        cfg.pop(k, None)
    if isinstance(model_type, str) and model_type not in CONFIG_MAPPING_NAMES and "auto_map" in cfg:
        return _from_remote_code(spec, dtype)
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING_NAMES:
        close = __import__("difflib").get_close_matches(str(model_type), list(CONFIG_MAPPING_NAMES), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise AuditInputError(f"{spec.model_source}: model_type: {model_type!r} is not a model type transformers "
                              f"{transformers.__version__} knows{hint}")
    if "auto_map" in cfg:
        # transformers ships this model type: from_pretrained uses its own classes unless the user
        # passes trust_remote_code=True, and the remote code is not read here (no code is downloaded).
        cfg.pop("auto_map")
        spec.input_notes.append(f"auto_map ignored: transformers {transformers.__version__} ships model type "
                                f"{model_type!r}, whose built-in classes are audited"
                                + (" (--trust-remote-code has no effect)." if spec.trust_remote_code else "."))
    config_cls = CONFIG_MAPPING[model_type]
    _check_required(cfg, config_cls, spec.model_source)
    cls = _architecture_class(archs, config_cls, model_type, spec)
    try:
        config = config_cls(**cfg)
    except _BUILD_ERRORS + _strict_errors() as e:
        raise AuditInputError(f"{spec.model_source}: {_config_error(e, cfg)}") from None
    with torch.device("meta"):
        try:
            if cls is not None:
                model = cls._from_config(config, dtype=dtype)
            else:
                model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
        except _BUILD_ERRORS + _strict_errors() as e:
            raise AuditInputError(f"{spec.model_source}: cannot build {archs[0] if archs else model_type}: "
                                  f"{_config_error(e, cfg)}") from None
    return model, (archs[0] if archs else type(model).__name__)


def _strict_errors() -> tuple:
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # older huggingface_hub: configs are not strict dataclasses
        return ()
    return (StrictDataclassError,)


def _config_error(e: BaseException, cfg: Optional[dict] = None) -> str:
    """One line for a config error, starting with the field it is about when that can be told:
    huggingface_hub's strict-dataclass errors carry it (or their cause names it in prose)."""
    cause = e.__cause__ if _strict_errors() and isinstance(e, _strict_errors()) else None
    if isinstance(e, KeyError) and e.args and cfg:  # a lookup table without this value: name the field
        where = _field_with_value(cfg, e.args[0])
        if where:
            return f"{where}: {e.args[0]!r} is not a value transformers knows for it"
    text = _one_line(cause if cause is not None else e) or type(e).__name__
    field = getattr(e, "field", None)
    if not field and cfg:
        low = text.lower()
        field = next((k for k in cfg if isinstance(k, str) and "_" in k
                      and (k in low or k.replace("_", " ") in low)), None)
    return f"{field}: {text}" if field and not text.startswith(f"{field}:") and f"'{field}'" not in text else text


def _field_with_value(cfg: dict, value, prefix: str = "") -> Optional[str]:
    for k, v in cfg.items():
        if isinstance(v, dict):
            found = _field_with_value(v, value, f"{prefix}{k}.")
            if found:
                return found
        elif isinstance(v, str) and v == value:
            return f"{prefix}{k}"
    return None


def _check_required(cfg: dict, config_cls, source: str) -> None:
    """A config.json without hidden_size would silently get the config class's default (4096 for Llama)."""
    import inspect

    try:
        params = inspect.signature(config_cls.__init__).parameters
    except (TypeError, ValueError):  # pragma: no cover
        return
    aliases = getattr(config_cls, "attribute_map", {}) or {}
    for key in _REQUIRED_FIELDS:
        if key not in params or key in cfg or any(a in cfg for a, t in aliases.items() if t == key):
            continue
        default = params[key].default
        if default is inspect.Parameter.empty:
            continue
        raise AuditInputError(f"{source}: {key}: missing (transformers would build {config_cls.__name__}'s default "
                              f"{default!r}, which is not this model)")


def _architecture_class(archs: list, config_cls, model_type: str, spec: AuditSpec):
    """The class `architectures[0]` names; refused when transformers has none or it is another model's."""
    import transformers

    if not archs:
        return None
    cls = getattr(transformers, archs[0], None)
    if cls is None or not hasattr(cls, "_from_config"):
        from transformers.models.auto import modeling_auto

        known = sorted({c for name in dir(modeling_auto) if not name.startswith("CONFIG") if name.endswith("_MAPPING_NAMES")
                        for c in _flat(getattr(modeling_auto, name).get(model_type)
                                       if isinstance(getattr(modeling_auto, name), dict) else None)})
        raise AuditInputError(f"{spec.model_source}: architectures: {archs[0]!r} is not a class transformers "
                              f"{transformers.__version__} has" + (f" (model type {model_type!r} has "
                              f"{', '.join(known[:6])})" if known else ""))
    own = getattr(cls, "config_class", None)
    if own is not None and own is not config_cls and not issubclass(config_cls, own):
        raise AuditInputError(f"{spec.model_source}: architectures: {archs[0]} is built from {own.__name__}, but "
                              f"model_type {model_type!r} makes a {config_cls.__name__}")
    return cls


def _flat(v) -> list:
    if v is None:
        return []
    return list(v) if isinstance(v, (tuple, list)) else [v]


def _from_remote_code(spec: AuditSpec, dtype):
    """A model type transformers does not ship, whose config names its code in auto_map: run that
    code from the model's local directory (only with --trust-remote-code; nothing is downloaded)."""
    import torch
    import transformers

    mt = spec.config.get("model_type")
    if not spec.trust_remote_code:
        raise AuditInputError(f"{spec.model_source}: model_type {mt!r} is not built into transformers "
                              f"{transformers.__version__}; its config names custom code (auto_map): pass "
                              f"--trust-remote-code to run it")
    d = spec.model_dir
    code = sorted(p.name for p in d.glob("*.py")) if d is not None and d.is_dir() else []
    if not code:
        raise AuditInputError(f"{spec.model_source}: auto_map names custom code, but no .py files are next to "
                              f"config.json; fsdplint reads only config files from the hub, so put the model's "
                              f"code files in that directory")
    try:
        config = transformers.AutoConfig.from_pretrained(str(d), trust_remote_code=True)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=True)
    except _BUILD_ERRORS + _strict_errors() + (ImportError, OSError) as e:
        raise AuditInputError(f"{spec.model_source}: the custom code ({', '.join(code)}) failed: "
                              f"{_config_error(e)}") from None
    spec.input_notes.append(f"model built with the custom code next to config.json ({', '.join(code)}).")
    archs = spec.config.get("architectures") or []
    return model, (archs[0] if archs else type(model).__name__)


def _model_type_for(archs: list[str], spec: AuditSpec) -> str:
    from transformers.models.auto import modeling_auto

    for name in dir(modeling_auto):
        table = getattr(modeling_auto, name)
        if name.endswith("_MAPPING_NAMES") and isinstance(table, dict):
            for mt, cls in table.items():
                if cls in archs or (isinstance(cls, tuple) and set(cls) & set(archs)):
                    return mt
    raise AuditInputError(f"{spec.model_source}: no 'model_type', and architectures {archs} are unknown "
                          f"to transformers")


def _config_dtype(cfg: dict):
    name = cfg.get("dtype") or cfg.get("torch_dtype")
    if isinstance(name, str) and name.replace("torch.", "") in ("float32", "float16", "bfloat16"):
        return torch_dtype(name.replace("torch.", ""))
    return None


def _from_factory(spec: AuditSpec):
    import torch

    modname, funcname = spec.factory.split(":")
    added = str(spec.base_dir)
    sys.path.insert(0, added)
    try:
        try:
            module = importlib.import_module(modname)
        except ImportError as e:
            raise AuditInputError(f"{spec.filename}: model.factory: cannot import {modname!r}: {e}") from None
        func = module
        for part in funcname.split("."):
            func = getattr(func, part, None)
        if not callable(func):
            raise AuditInputError(f"{spec.filename}: model.factory: {spec.factory!r} is not a function")
        with torch.device("meta"):
            model = func(**spec.factory_kwargs)
    finally:
        if added in sys.path:
            sys.path.remove(added)
    if not isinstance(model, torch.nn.Module):
        raise AuditInputError(f"{spec.filename}: model.factory: {spec.factory} returned "
                              f"{type(model).__name__}, not a torch.nn.Module")
    if spec.dtype:
        model = model.to(torch_dtype(spec.dtype))
    return model


def _note_prequantized(spec: AuditSpec, built: Built) -> None:
    """A pre-quantized checkpoint (mxfp4, fp8, gptq, awq, ...) is audited as its dequantized weights.

    LoRA fine-tuning under FSDP loads these checkpoints dequantized (e.g. gpt-oss with
    `Mxfp4Config(dequantize=True)`); their packed formats are not sharded by FSDP here.
    """
    import inspect

    from transformers.quantizers.auto import AUTO_QUANTIZATION_CONFIG_MAPPING

    from fsdplint.audit.params import dtype_name

    method = spec.prequantized["quant_method"]
    cls = AUTO_QUANTIZATION_CONFIG_MAPPING.get(method)
    if cls is None:
        raise AuditInputError(f"{spec.model_source}: quantization_config.quant_method: {method!r} is not a "
                              f"quantization method transformers knows (known: bitsandbytes, "
                              f"{', '.join(sorted(k for k in AUTO_QUANTIZATION_CONFIG_MAPPING if 'bitsandbytes' not in k)[:12])}, ...)")
    if spec.quantization:
        spec.input_notes.append(f"quantization_config ({method}) replaced by the bitsandbytes quantization asked for.")
        return
    how = (f"as transformers loads it with {cls.__name__}(dequantize=True)"
           if "dequantize" in inspect.signature(cls.__init__).parameters else "as unquantized weights")
    spec.input_notes.append(f"{method} pre-quantized checkpoint: audited dequantized to {dtype_name(built.dtype)}, "
                            f"{how}; memory figures are for {dtype_name(built.dtype)} weights "
                            f"(--quant 4bit audits a bitsandbytes QLoRA load instead).")


def quantize_as_from_pretrained(model, bnb_config, dtype):
    """Run transformers' own bitsandbytes quantizer on a model built on meta, as `from_pretrained` does
    (the audit and the dry run both build models this way); returns the quantizer."""
    import torch
    from transformers.modeling_utils import local_torch_dtype
    from transformers.quantizers import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(bnb_config)
    # from_pretrained swaps the modules inside its init context: the new modules' biases get the
    # model dtype, not float32 (transformers 5.24 modeling_utils.from_pretrained).
    with local_torch_dtype(dtype if dtype.is_floating_point else torch.float32):
        quantizer.preprocess_model(model, device_map={"": "cpu"}, dtype=dtype)
    quantizer.postprocess_model(model)
    return quantizer


def _quantize(spec: AuditSpec, built: Built) -> None:
    """Swap linears for bitsandbytes modules the way `from_pretrained` does, on meta."""
    import torch
    from transformers import BitsAndBytesConfig

    q = dict(spec.quantization)
    for k in ("bnb_4bit_quant_storage", "bnb_4bit_compute_dtype"):
        if isinstance(q.get(k), str):
            q[k] = getattr(torch, q[k].replace("torch.", ""))
    try:
        bnb_config = BitsAndBytesConfig(**q)
    except (TypeError, ValueError) as e:
        raise AuditInputError(f"{spec.filename}: quantization: {_one_line(e)}") from None
    if spec.factory:
        from transformers.integrations.bitsandbytes import replace_with_bnb_linear

        built.model = built.base = replace_with_bnb_linear(built.base, quantization_config=bnb_config)
        if bnb_config.load_in_4bit:
            built.base.is_loaded_in_4bit = True
        else:
            built.base.is_loaded_in_8bit = True
    else:
        quantize_as_from_pretrained(built.base, bnb_config, built.dtype)
    built.quant_config = bnb_config
    built.quantized = "4bit" if bnb_config.load_in_4bit else "8bit"
    built.quant_storage = bnb_config.bnb_4bit_quant_storage if bnb_config.load_in_4bit else torch.int8


def _lora_kwargs(spec: AuditSpec) -> dict:
    import peft

    fields = {f.name for f in dataclasses.fields(peft.LoraConfig)}
    raw = dict(spec.lora)
    # adapter_config.json carries bookkeeping keys that are not LoraConfig arguments.
    for k in ("peft_type", "base_model_name_or_path", "revision", "inference_mode", "auto_mapping",
              "peft_version"):
        raw.pop(k, None)
    if "autocast_adapter_dtype" in raw:  # get_peft_model's argument, written next to the LoRA fields
        v = raw.pop("autocast_adapter_dtype")
        if not isinstance(v, bool):
            raise AuditInputError(f"{spec.filename}: lora.autocast_adapter_dtype: expected true or false, got {v!r}")
        spec.autocast_adapter_dtype = v
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise AuditInputError(f"{spec.filename}: lora: unknown LoraConfig field {unknown[0]!r}")
    _check_lora_types(raw, spec.filename)
    if isinstance(raw.get("target_modules"), list) and not raw["target_modules"]:
        raise AuditInputError(f"{spec.filename}: lora.target_modules: empty list")
    return raw


def _check_lora_types(raw: dict, filename: str) -> None:
    """Wrong JSON types (r: "eight") fail inside peft with a TypeError that names no field: name it."""
    import typing

    import peft

    hints = typing.get_type_hints(peft.LoraConfig)
    for key, value in raw.items():
        if key in hints and not _fits(value, hints[key]):
            pretty = str(hints[key]).replace("typing.", "").replace("<class '", "").replace("'>", "")
            raise AuditInputError(f"{filename}: lora.{key}: expected {pretty}, got {value!r}")


def _fits(value: Any, hint: Any) -> bool:
    """A lenient check of a JSON value against a LoraConfig annotation (unknown shapes pass)."""
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return value is None
    if origin is typing.Union:
        return any(_fits(value, a) for a in args)
    if origin is typing.Literal:
        return value in args or any(isinstance(value, type(a)) and not isinstance(value, bool) for a in args)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple)) and (not args or all(_fits(v, args[0]) for v in value))
    if hint in (int, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint in (bool, str, dict):
        return isinstance(value, hint)
    return True


def _apply_lora(spec: AuditSpec, built: Built) -> None:
    import peft

    kwargs = _lora_kwargs(spec)
    try:
        config = peft.LoraConfig(**kwargs)
    except (TypeError, ValueError) as e:
        raise AuditInputError(f"{spec.filename}: lora: {_one_line(e)}") from None
    built.lora_config = config
    built.user_targets = _as_targets(config.target_modules)
    import torch

    try:
        # On meta, so adapter init (kaiming/zeros) costs nothing even for 405B-class models.
        with torch.device("meta"):
            # peft's own fp32 upcast runs below, after the dtype cast peft skips on meta.
            model = peft.get_peft_model(built.base, config, autocast_adapter_dtype=False)
    except (ValueError, TypeError) as e:
        # peft's own refusals (nothing matched, fused experts...) are findings, not crashes.
        try:
            if isinstance(e, TypeError):
                raise AuditInputError(f"peft could not apply the LoRA config: {_one_line(e)}")
            built.problems.append(_classify_peft_error(e, config))
        except AuditInputError as err:
            raise AuditInputError(f"{spec.filename}: lora: {err}") from None
        for p in built.base.parameters():
            p.requires_grad_(False)
        built.coverage = [TargetCoverage(t, 0) for t in (built.user_targets or [])]
        return
    built.adapter_dtypes = _adapters_to_base_dtype(model)
    from peft.tuners.tuners_utils import cast_adapter_dtype

    for name in model.peft_config:
        cast_adapter_dtype(model, adapter_name=name, autocast_adapter_dtype=spec.autocast_adapter_dtype)
    if spec.cast_after_lora:
        _cast_floats(model, torch_dtype(spec.cast_after_lora))
    built.model = model
    built.lora_applied = True
    built.peft_trainable = model.get_nb_trainable_parameters()[0]
    final = model.peft_config["default"]
    # No targets given: peft picked its defaults for the architecture; report those.
    built.coverage = _coverage(model, built.user_targets or _as_targets(final.target_modules), final)


def _adapters_to_base_dtype(model) -> dict:
    """Give each adapter its base layer's dtype, as peft's `_move_adapter_to_device_of_base_layer` does
    (peft/tuners/tuners_utils.py, peft 0.21.2) everywhere but on meta, where it skips the cast.

    The base dtype is the weight's, or a bnb 4-bit layer's `compute_dtype`. Returns {param name: (dtype,
    why)} for the adapter parameters, before peft's fp32 autocast.
    """
    import torch.nn as nn
    from peft.tuners.tuners_utils import BaseTunerLayer

    try:
        from peft.tuners.lora.layer import ParamWrapper
    except ImportError:  # peft < 0.17
        ParamWrapper = ()
    out = {}
    for mname, mod in model.named_modules():
        if not isinstance(mod, BaseTunerLayer):
            continue
        base = mod.get_base_layer()
        if isinstance(base, nn.MultiheadAttention):
            base = base.out_proj
        if ParamWrapper and isinstance(mod, ParamWrapper):
            dt, why = mod.get_param().dtype, "the adapted parameter's dtype"
        else:
            _, dt = mod._get_base_layer_device_and_dtype(base)
            why = ("the 4-bit layer's compute dtype (bnb_4bit_compute_dtype)" if hasattr(base, "compute_dtype")
                   else "the base layer's dtype")
        if dt is None or not (dt.is_floating_point or dt.is_complex):
            continue
        for attr in mod.adapter_layer_names:
            layer = getattr(mod, attr, None)
            if not isinstance(layer, (nn.ModuleDict, nn.ParameterDict)):
                continue
            for pname, p in layer.named_parameters():
                if p.is_floating_point() and p.dtype != dt:
                    p.data = p.data.to(dt)
                out[f"{mname}.{attr}.{pname}"] = (dt, why)
    return out


def _cast_floats(model, dtype) -> None:
    """`model.to(dtype)` as a script does it after get_peft_model; 4/8-bit weights keep their kind."""
    for mod in model.modules():
        for name, p in mod._parameters.items():
            if p is not None and p.is_floating_point() and type(p).__name__ not in ("Params4bit", "Int8Params"):
                p.data = p.data.to(dtype)


def _as_targets(tm) -> Optional[list[str]]:
    if tm is None:
        return None
    if isinstance(tm, str):
        return [tm]
    return sorted(tm)


def _classify_peft_error(e: Exception, config) -> BuildProblem:
    msg = _one_line(e)
    low = msg.lower()
    if "fused" in low or "expert" in low:
        return BuildProblem("FSDP301", f"peft refused the LoRA targets: {msg}", "lora.target_modules")
    if "target" in low:
        return BuildProblem("FSDP113", f"peft refused the LoRA targets: {msg}", "lora.target_modules")
    raise AuditInputError(f"peft could not apply the LoRA config: {msg}")


def _coverage(model, targets: Optional[list[str]], final_config) -> list[TargetCoverage]:
    """Per target name: the LoRA layers peft created whose module name it matches."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    prefix = "base_model.model."
    layers = []
    for name, mod in model.named_modules():
        if isinstance(mod, BaseTunerLayer) and not name.endswith(".base_layer"):
            layers.append(name[len(prefix):] if name.startswith(prefix) else name)
    if not targets:
        return []
    final_modules = _as_targets(final_config.target_modules) or []
    converted = set(targets) - set(final_modules) if getattr(final_config, "target_parameters", None) else set()
    out = []
    for t in targets:
        if t == "all-linear" or (len(targets) == 1 and isinstance(final_config.target_modules, str)
                                 and t == final_config.target_modules):
            hit = [k for k in layers if t == "all-linear" or re.fullmatch(t, k)]
            out.append(TargetCoverage(t, len(hit), "all linear layers" if t == "all-linear" else "regex", hit))
            continue
        hit = [k for k in layers if k == t or k.endswith("." + t)]
        note = ""
        if not hit and t in converted:
            hit = [k for k in layers if k.endswith(".experts") or ".experts." in k]
            note = "peft converted it to target_parameters (fused experts)"
        out.append(TargetCoverage(t, len(hit), note, hit))
    return out


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 400 else text[:397] + "..."
