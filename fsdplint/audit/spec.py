"""Audit input: a Hugging Face `config.json` or an fsdplint audit spec (JSON or TOML).

An audit spec bundles four sections::

    {
      "model": "llama3_8b.json",            # or an inline config dict, or
                                             # {"factory": "pkg.module:function", "kwargs": {...}}
      "dtype": "bfloat16",
      "lora": {"r": 16, "target_modules": ["q_proj", "v_proj"]},   # or "adapter_config.json"
      "quantization": {"load_in_4bit": true, "bnb_4bit_quant_storage": "bfloat16"},
      "fsdp": {"version": 2, "world_size": 8, "wrap": ["LlamaDecoderLayer"],
               "mixed_precision": {"param_dtype": "bfloat16"}, "ignored_params": "4bit"},
      "gpu_memory": "80GiB",
      "training": {"seq_len": 4096, "micro_batch": 2, "activation_checkpointing": true}
    }

Parsing never imports torch: dtypes stay strings until the model is built.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from fsdplint.errors import AuditInputError  # noqa: F401 (re-exported: callers import it from here)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


DTYPES = ("float32", "float16", "bfloat16", "float64")
_DTYPE_ALIASES = {
    "fp32": "float32", "float": "float32", "float32": "float32", "torch.float32": "float32",
    "fp16": "float16", "half": "float16", "float16": "float16", "torch.float16": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16", "torch.bfloat16": "bfloat16",
    "fp64": "float64", "float64": "float64", "double": "float64", "torch.float64": "float64",
}
_STORAGE_DTYPES = dict(_DTYPE_ALIASES, uint8="uint8", **{"torch.uint8": "uint8"})

SPEC_SECTIONS = ("model", "dtype", "lora", "quantization", "fsdp", "gpu_memory", "trust_remote_code", "training")
TRAINING_KEYS = ("seq_len", "micro_batch", "activation_checkpointing", "adamw_fused")
FSDP_KEYS = (
    "version", "world_size", "wrap", "use_orig_params", "mixed_precision", "mp_policy", "ignored_params",
    "reshard_after_forward", "shard_root", "auto_wrap_policy", "min_num_params", "torch", "offload_params",
)
FSDP1_POLICIES = {
    "transformer_based_wrap": "transformer", "transformer": "transformer",
    "size_based_wrap": "size", "size": "size",
    "no_wrap": "none", "none": "none",
    "peft": "peft", "fsdp_auto_wrap_policy": "peft",
}
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 10**3, "m": 10**6, "g": 10**9}


@dataclass
class FsdpSpec:
    version: int = 2
    world_size: int = 8
    # Class names of the modules that become units; None = the model's `_no_split_modules`.
    wrap: Optional[list[str]] = None
    use_orig_params: bool = False
    # {"param_dtype": ..., "reduce_dtype": ...} as dtype names, or None.
    mixed_precision: Optional[dict[str, Optional[str]]] = None
    # None, "4bit" (every bitsandbytes 4-bit param) or a list of fnmatch patterns over param names.
    ignored_params: Any = None
    reshard_after_forward: Optional[bool] = None
    shard_root: bool = True
    # FSDP1 only: "transformer" (default), "size", "none", "peft".
    auto_wrap_policy: str = "transformer"
    min_num_params: int = 100_000_000
    # CPU offload (FSDP1 CPUOffload(offload_params=True), FSDP2 CPUOffloadPolicy, accelerate's
    # fsdp_offload_params): parameter shards, gradients and optimizer state live in host memory.
    offload_params: bool = False
    # Target torch version for version-dependent checks; None = the installed torch.
    torch: Optional[str] = None


@dataclass
class TrainingSpec:
    """One training step's shape, for the activation estimate and the optimizer's placement."""

    seq_len: Optional[int] = None  # None: activations are not estimated
    micro_batch: int = 1
    activation_checkpointing: bool = False
    # AdamW(fused=True) (transformers' default optim with torch >= 2.8) keeps `step` on the GPU;
    # torch's default keeps it on the CPU.
    adamw_fused: bool = False


@dataclass
class AuditSpec:
    """A validated audit request. `filename` is where findings point."""

    filename: str
    # Exactly one of `config` (a Hugging Face config dict) and `factory` ("module:function").
    config: Optional[dict] = None
    factory: Optional[str] = None
    factory_kwargs: dict = field(default_factory=dict)
    base_dir: Path = field(default_factory=Path.cwd)
    dtype: Optional[str] = None
    trust_remote_code: bool = False
    lora: Optional[dict] = None
    quantization: Optional[dict] = None
    fsdp: FsdpSpec = field(default_factory=FsdpSpec)
    gpu_memory: Optional[int] = None
    training: TrainingSpec = field(default_factory=TrainingSpec)
    # The source text, to point findings at the line of a key.
    text: str = ""
    # Known positions of fields, e.g. {"lora.target_modules": (12, 5)} from a training script.
    locations: dict = field(default_factory=dict)
    # Where the "model" config came from (for the report).
    model_source: str = ""
    # Target-version inputs, resolved as on the static side when `fsdp.torch` is unset:
    # explicit versions (--target-version), `[tool.fsdplint] target-version`, and the file
    # near which to look for declared requirements (None: the spec file, if it exists).
    target_versions: dict = field(default_factory=dict)
    config_targets: dict = field(default_factory=dict)
    config_source: str = "[tool.fsdplint]"
    version_path: Optional[Path] = None
    # What the training script does around get_peft_model: peft's fp32 adapter cast
    # (autocast_adapter_dtype) and a dtype cast of the whole PEFT model before wrapping.
    autocast_adapter_dtype: bool = True
    cast_after_lora: Optional[str] = None
    # A pre-quantized checkpoint's quantization_config (mxfp4, fp8, gptq, ...): audited dequantized.
    prequantized: Optional[dict] = None
    # The directory config.json was read from (a local model directory or a hub cache snapshot).
    model_dir: Optional[Path] = None
    # What the input resolution did that the user should know (hub snapshot read, auto_map ignored, ...).
    input_notes: list = field(default_factory=list)

    def position_of(self, fieldpath: Optional[str]) -> tuple[int, int]:
        """(row, col) of a dotted field such as "lora.target_modules"; (1, 1) when unknown."""
        if not fieldpath:
            return (1, 1)
        parts = fieldpath.split(".")
        for n in range(len(parts), 0, -1):
            key = ".".join(parts[:n])
            if key in self.locations:
                return tuple(self.locations[key])
        return _locate_key(self.text, parts) if self.text else (1, 1)


def _locate_key(text: str, parts: list[str]) -> tuple[int, int]:
    """Find a (possibly nested) key in JSON or TOML text; falls back to the outer key."""
    lines = text.splitlines()
    start, found = 0, (1, 1)
    for part in parts:
        pat = re.compile(
            r'(?:"%s"\s*:)|(?:^\s*%s\s*=)|(?:^\s*\[(?:[\w.]+\.)?%s\]\s*$)' % ((re.escape(part),) * 3)
        )
        for i in range(start, len(lines)):
            m = pat.search(lines[i])
            if m:
                col = m.start() + (len(lines[i][m.start():]) - len(lines[i][m.start():].lstrip()))
                found, start = (i + 1, col + 1), i + 1
                break
        else:
            break
    return found


def parse_size(value: Any, where: str) -> int:
    """'80GiB', '80 GB', 80e9 -> bytes."""
    if isinstance(value, bool):
        raise AuditInputError(f"{where}: expected a memory size such as 80GiB, got {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise AuditInputError(f"{where}: expected a memory size such as 80GiB, got {value!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def normalize_dtype(value: Any, where: str, *, storage: bool = False) -> str:
    table = _STORAGE_DTYPES if storage else _DTYPE_ALIASES
    name = str(value).strip().lower()
    if name not in table:
        allowed = ", ".join(sorted(set(table.values())))
        raise AuditInputError(f"{where}: unknown dtype {value!r} (expected one of {allowed})")
    return table[name]


def _read_mapping(path: Path, what: str) -> tuple[dict, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AuditInputError(f"{path}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise AuditInputError(f"{path}: cannot read {what}: {e}") from None
    if path.suffix.lower() == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise AuditInputError(f"{path}: invalid TOML: {e}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise AuditInputError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise AuditInputError(f"{path}: expected a JSON object / TOML table at top level")
    return data, text


def is_hf_config(data: Mapping) -> bool:
    return "model" not in data and ("model_type" in data or "architectures" in data)


def load_spec(path: str | Path, overrides: Optional[Mapping[str, Any]] = None) -> AuditSpec:
    """Read CONFIG (HF config.json or audit spec), apply CLI overrides, validate."""
    from fsdplint.audit.hub import resolve

    found = resolve(str(path))
    path = found.config
    data, text = _read_mapping(path, "config")
    if is_hf_config(data):
        raw = {"model": data}
        qc = data.get("quantization_config")
        method = qc.get("quant_method", "bitsandbytes") if isinstance(qc, dict) else None
        quant_flag = (overrides or {}).get("quant")
        # --quant none drops any quantization_config; --quant 4bit/8bit replaces a non-bitsandbytes one.
        replaced = qc is not None and quant_flag and (quant_flag == "none" or method != "bitsandbytes")
        if qc is not None and not replaced:
            raw["quantization"] = qc
        if found.adapter is not None:
            raw["lora"] = str(found.adapter)
        spec = spec_from_dict(raw, filename=str(path), base_dir=path.parent, text=text,
                              model_source=str(path))
        spec.model_dir = path.parent
        if replaced:
            spec.input_notes.append(f"config.json's quantization_config ({method}) ignored: --quant {quant_flag}.")
    elif any(k in data for k in SPEC_SECTIONS):
        spec = spec_from_dict(data, filename=str(path), base_dir=path.parent, text=text)
    else:
        raise AuditInputError(
            f"{path}: neither a Hugging Face config (no 'model_type'/'architectures') "
            f"nor an fsdplint audit spec (no 'model' section)"
        )
    spec.input_notes[:0] = found.notes
    if overrides:
        apply_overrides(spec, overrides)
    spec.input_notes = [n for n in spec.input_notes if n]
    return spec


def spec_from_dict(data: Mapping, *, filename: str = "<spec>", base_dir: Optional[Path] = None,
                   text: str = "", model_source: str = "", locations: Optional[dict] = None) -> AuditSpec:
    """Validate an audit-spec dict (the shape of the JSON file) into an AuditSpec."""
    data = copy.deepcopy(dict(data))
    base_dir = Path(base_dir) if base_dir is not None else Path.cwd()
    where = filename
    unknown = sorted(set(data) - set(SPEC_SECTIONS))
    if unknown:
        raise AuditInputError(
            f"{where}: unknown section {unknown[0]!r} (expected {', '.join(SPEC_SECTIONS)})"
        )
    spec = AuditSpec(filename=filename, base_dir=base_dir, text=text, locations=dict(locations or {}))
    _parse_model(spec, data.get("model"), model_source)
    if "dtype" in data and data["dtype"] is not None:
        spec.dtype = normalize_dtype(data["dtype"], f"{where}: dtype")
    if "trust_remote_code" in data:  # else model.trust_remote_code (read above) stands
        spec.trust_remote_code = _bool(data["trust_remote_code"], f"{where}: trust_remote_code")
    spec.lora = _parse_lora(data.get("lora"), where, base_dir)
    _set_quant(spec, _parse_quant(data.get("quantization"), where))
    spec.fsdp = _parse_fsdp(data.get("fsdp") or {}, where)
    if data.get("gpu_memory") is not None:
        spec.gpu_memory = parse_size(data["gpu_memory"], f"{where}: gpu_memory")
    spec.training = _parse_training(data.get("training") or {}, where)
    return spec


def _check_section(value: Any, name: str, keys, where: str) -> None:
    """A spec section must be an object with known keys only; else one line naming the section and key."""
    if not isinstance(value, dict):
        raise AuditInputError(f"{where}: {name}: expected an object, got {value!r}")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise AuditInputError(f"{where}: {name}: unknown key {unknown[0]!r} (expected {', '.join(keys)})")


def _parse_training(t: Any, where: str) -> TrainingSpec:
    _check_section(t, "training", TRAINING_KEYS, where)
    s = TrainingSpec()
    w = f"{where}: training"
    if t.get("seq_len") is not None:
        s.seq_len = _int(t["seq_len"], f"{w}.seq_len")
    if t.get("micro_batch") is not None:
        s.micro_batch = _int(t["micro_batch"], f"{w}.micro_batch")
    if "activation_checkpointing" in t:
        s.activation_checkpointing = _bool(t["activation_checkpointing"], f"{w}.activation_checkpointing")
    if "adamw_fused" in t:
        s.adamw_fused = _bool(t["adamw_fused"], f"{w}.adamw_fused")
    return s


def _bool(v: Any, where: str) -> bool:
    if isinstance(v, bool):
        return v
    raise AuditInputError(f"{where}: expected true or false, got {v!r}")


def _int(v: Any, where: str, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise AuditInputError(f"{where}: expected an integer >= {minimum}, got {v!r}")
    return v


def _parse_model(spec: AuditSpec, model: Any, model_source: str) -> None:
    where = f"{spec.filename}: model"
    if model is None:
        raise AuditInputError(f"{spec.filename}: missing 'model' section (a config path, a config dict "
                              f"or a factory)")
    if isinstance(model, str):
        model = {"config": model}
    if not isinstance(model, dict):
        raise AuditInputError(f"{where}: expected a path, a config object or a factory, got {model!r}")
    if "model_type" in model or "architectures" in model:
        model = {"config": model}
    unknown = sorted(set(model) - {"config", "factory", "kwargs", "dtype", "trust_remote_code"})
    if unknown:
        raise AuditInputError(f"{where}: unknown key {unknown[0]!r} (expected config, factory, kwargs, "
                              f"dtype, trust_remote_code)")
    if ("config" in model) == ("factory" in model):
        raise AuditInputError(f"{where}: give exactly one of 'config' and 'factory'")
    if "factory" in model:
        fac = model["factory"]
        if not isinstance(fac, str) or not re.fullmatch(r"[\w.]+:[\w.]+", fac):
            raise AuditInputError(f"{where}.factory: expected 'package.module:function', got {fac!r}")
        spec.factory = fac
        kwargs = model.get("kwargs", {})
        if not isinstance(kwargs, dict):
            raise AuditInputError(f"{where}.kwargs: expected an object, got {kwargs!r}")
        spec.factory_kwargs = kwargs
        spec.model_source = model_source or fac
    else:
        cfg = model["config"]
        if isinstance(cfg, str):
            p = Path(cfg)
            if not p.is_absolute():
                p = spec.base_dir / p
            if not p.exists():
                from fsdplint.audit.hub import looks_like_hub_id, resolve

                if looks_like_hub_id(cfg):
                    found = resolve(cfg)
                    p = found.config
                    spec.input_notes.extend(found.notes)
            if p.is_dir():
                p = p / "config.json"
            cfg, _ = _read_mapping(p, "model config")
            spec.model_source = str(p)
            spec.model_dir = p.parent
        elif isinstance(cfg, dict):
            spec.model_source = model_source or f"{spec.filename} (inline config)"
        else:
            raise AuditInputError(f"{where}.config: expected a path or an object, got {cfg!r}")
        if "model_type" not in cfg and "architectures" not in cfg:
            raise AuditInputError(f"{spec.model_source}: not a Hugging Face config "
                                  f"(no 'model_type' or 'architectures')")
        check_config_values(cfg, spec.model_source)
        check_model_size(cfg, spec.model_source)
        spec.config = cfg
    if model.get("dtype") is not None:
        spec.dtype = normalize_dtype(model["dtype"], f"{where}.dtype")
    if "trust_remote_code" in model:
        spec.trust_remote_code = _bool(model["trust_remote_code"], f"{where}.trust_remote_code")


# Size fields that must be positive integers wherever they appear (top level or a sub-config such as
# text_config). transformers' strict config dataclasses reject some wrong types with a traceback, and
# accept 0 or negative layer counts silently (a model with no layers).
POSITIVE_INT_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "vocab_size", "head_dim", "max_position_embeddings", "moe_intermediate_size", "num_local_experts",
    "num_experts_per_tok", "n_routed_experts", "n_embd", "n_layer", "n_head", "n_positions", "d_model",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
)
# Dtypes a checkpoint's weights can be loaded in ("auto" and null let the caller decide).
CONFIG_DTYPES = ("float32", "float16", "bfloat16", "float64")


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def check_config_values(cfg: Mapping, source: str, _path: str = "") -> None:
    """Refuse values no real model has, naming the field (the model would not build, or build wrong)."""
    for key in POSITIVE_INT_FIELDS:
        if key in cfg and cfg[key] is not None and not _positive_int(cfg[key]):
            raise AuditInputError(f"{source}: {_path}{key}: expected a positive integer, got {cfg[key]!r}")
    for key in ("torch_dtype", "dtype"):
        v = cfg.get(key)
        if v is None or (isinstance(v, str) and v == "auto"):
            continue
        name = v.replace("torch.", "") if isinstance(v, str) else v
        if name not in CONFIG_DTYPES:
            raise AuditInputError(f"{source}: {_path}{key}: {v!r} is not a dtype model weights are loaded in "
                                  f"(expected one of {', '.join(CONFIG_DTYPES)} or \"auto\")")
    archs = cfg.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) and a for a in archs)):
        raise AuditInputError(f"{source}: {_path}architectures: expected a list of class names, got {archs!r}")
    vocab = cfg.get("vocab_size")
    for key in ("pad_token_id",):
        v = cfg.get(key)
        if v is None or not _positive_int(vocab):
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not -vocab <= v < vocab:
            raise AuditInputError(f"{source}: {_path}{key}: {v!r} is not a token id below vocab_size {vocab}")
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    own_head_dims = cfg.get("head_dim") is not None or cfg.get("qk_nope_head_dim") is not None  # MLA: its own
    if _positive_int(heads) and _positive_int(hidden) and not own_head_dims and hidden % heads:
        raise AuditInputError(f"{source}: {_path}hidden_size: {hidden} is not a multiple of num_attention_heads "
                              f"{heads} (and no head_dim is given)")
    kv = cfg.get("num_key_value_heads")
    if _positive_int(heads) and _positive_int(kv) and heads % kv:
        raise AuditInputError(f"{source}: {_path}num_key_value_heads: {heads} attention heads cannot be split "
                              f"into {kv} key/value groups")
    for k, v in cfg.items():
        if isinstance(v, Mapping) and k.endswith("_config") and k != "quantization_config":
            check_config_values(v, source, f"{_path}{k}.")


# Beyond any real model (the largest public ones are ~2e12 parameters and ~1e5 modules): such a
# config is a typo, and building it, even on the meta device, would take hours.
MAX_PARAMS = 10**13
MAX_MODULES = 500_000
_SIZE_FIELDS = {  # group: (config keys, largest value seen in real configs)
    "layers": (("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers"), 256),
    "hidden": (("hidden_size", "n_embd", "d_model", "n_embed", "dim"), 32768),
    "inter": (("moe_intermediate_size", "intermediate_size", "n_inner", "ffn_dim", "d_ff"), 131072),
    "experts": (("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"), 512),
    "vocab": (("vocab_size",), 1_000_000),
}


def _size_fields(cfg: Mapping) -> dict[str, tuple[str, int]]:
    out = {}
    for group, (keys, _) in _SIZE_FIELDS.items():
        for k in keys:
            v = cfg.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                out[group] = (k, v)
                break
    return out


def check_model_size(cfg: Mapping, source: str, _path: str = "") -> None:
    """Refuse configs whose rough parameter or module count (from the config alone) is absurd."""
    for k, v in cfg.items():  # sub-configs (text_config, vision_config, ...)
        if isinstance(v, Mapping):
            check_model_size(v, source, f"{_path}{k}.")
    f = _size_fields(cfg)
    get = lambda g, default: f[g][1] if g in f else default  # noqa: E731
    layers, hidden, experts, vocab = get("layers", 1), get("hidden", 0), get("experts", 1), get("vocab", 0)
    inter = get("inter", 4 * hidden)
    params = layers * (4 * hidden * hidden + 3 * hidden * inter * experts) + 2 * vocab * hidden
    modules = layers * (10 + 4 * experts)
    if params <= MAX_PARAMS and modules <= MAX_MODULES:
        return
    worst = max(f, key=lambda g: f[g][1] / _SIZE_FIELDS[g][1])
    key, value = f[worst]
    raise AuditInputError(
        f"{source}: {_path}{key}: {value:,} makes a model of about {params:.1e} parameters in {modules:,} "
        f"modules; fsdplint audits models up to {MAX_PARAMS:.0e} parameters and {MAX_MODULES:,} modules"
        .replace("e+", "e")
    )


# Planning runs torch's sharding for every rank: time grows with the world size.
MAX_WORLD_SIZE = 16384


def _world_size(v: Any, where: str) -> int:
    n = _int(v, where)
    if n > MAX_WORLD_SIZE:
        raise AuditInputError(f"{where}: {n:,} ranks is more than fsdplint plans for ({MAX_WORLD_SIZE:,}); "
                              f"for HSDP give the size of one shard group")
    return n


def _parse_lora(lora: Any, where: str, base_dir: Path) -> Optional[dict]:
    if lora is None or lora is False:
        return None
    if lora is True:
        return {}
    if isinstance(lora, str):
        p = Path(lora)
        if not p.is_absolute():
            p = base_dir / p
        if not p.exists():
            from fsdplint.audit.hub import ADAPTER, hub_file, looks_like_hub_id

            if looks_like_hub_id(lora):  # a hub adapter repo: its adapter_config.json through the cache
                repo, _, rev = lora.partition("@")
                found = hub_file(repo, ADAPTER, rev or None)
                if found is None:
                    raise AuditInputError(f"{lora}: no {ADAPTER} for this adapter id in the Hugging Face cache")
                p = found
        if p.is_dir():
            p = p / "adapter_config.json"
        lora, _ = _read_mapping(p, "adapter config")
        peft_type = str(lora.get("peft_type", "LORA")).upper()
        if peft_type != "LORA":
            raise AuditInputError(f"{p}: peft_type {peft_type!r} is not supported (only LORA)")
    if not isinstance(lora, dict):
        raise AuditInputError(f"{where}: lora: expected LoraConfig fields or a path, got {lora!r}")
    return dict(lora)


def _parse_quant(q: Any, where: str) -> Optional[dict]:
    if q is None or q is False or q == "none":
        return None
    if q in ("4bit", "8bit"):
        return {"load_in_4bit": True} if q == "4bit" else {"load_in_8bit": True}
    if not isinstance(q, dict):
        raise AuditInputError(f"{where}: quantization: expected BitsAndBytesConfig fields, '4bit', '8bit' "
                              f"or 'none', got {q!r}")
    q = dict(q)
    method = q.pop("quant_method", "bitsandbytes")
    if not isinstance(method, str) or not method.strip():
        raise AuditInputError(f"{where}: quantization.quant_method: expected a method name such as bitsandbytes, "
                              f"mxfp4 or fp8, got {method!r}")
    if method.lower() != "bitsandbytes":
        return {"quant_method": method.lower(), **q, PREQUANTIZED: True}
    # Keys transformers writes into config.json but BitsAndBytesConfig does not take.
    for k in ("_load_in_4bit", "_load_in_8bit"):
        q.pop(k, None)
    if not (q.get("load_in_4bit") or q.get("load_in_8bit")):
        return None
    if "bnb_4bit_quant_storage" in q and q["bnb_4bit_quant_storage"] is not None:
        q["bnb_4bit_quant_storage"] = normalize_dtype(
            q["bnb_4bit_quant_storage"], f"{where}: quantization.bnb_4bit_quant_storage", storage=True)
    return q


# Marks a _parse_quant result that is a pre-quantized checkpoint's config, not a BitsAndBytesConfig.
PREQUANTIZED = "__prequantized__"


def _set_quant(spec: AuditSpec, q: Optional[dict]) -> None:
    if q is not None and q.pop(PREQUANTIZED, False):
        spec.prequantized, spec.quantization = q, None
    else:
        spec.quantization = q


def _parse_fsdp(f: Any, where: str) -> FsdpSpec:
    _check_section(f, "fsdp", FSDP_KEYS, where)
    s = FsdpSpec()
    w = f"{where}: fsdp"
    if "version" in f:
        if f["version"] not in (1, 2, "1", "2"):
            raise AuditInputError(f"{w}.version: expected 1 or 2, got {f['version']!r}")
        s.version = int(f["version"])
    if "world_size" in f:
        s.world_size = _world_size(f["world_size"], f"{w}.world_size")
    if "wrap" in f and f["wrap"] is not None:
        wrap = f["wrap"]
        if isinstance(wrap, str):
            wrap = [c.strip() for c in wrap.split(",") if c.strip()]
        if not isinstance(wrap, list) or not all(isinstance(c, str) for c in wrap):
            raise AuditInputError(f"{w}.wrap: expected a list of module class names, got {wrap!r}")
        s.wrap = wrap
    if "use_orig_params" in f:
        s.use_orig_params = _bool(f["use_orig_params"], f"{w}.use_orig_params")
    if "offload_params" in f:
        s.offload_params = _bool(f["offload_params"], f"{w}.offload_params")
    mp = f.get("mixed_precision", f.get("mp_policy"))
    if mp is not None:
        if isinstance(mp, str):
            mp = {"param_dtype": mp}
        if not isinstance(mp, dict) or set(mp) - {"param_dtype", "reduce_dtype", "buffer_dtype",
                                                  "output_dtype", "cast_forward_inputs"}:
            raise AuditInputError(f"{w}.mixed_precision: expected {{param_dtype, reduce_dtype}}, got {mp!r}")
        s.mixed_precision = {
            k: (normalize_dtype(mp[k], f"{w}.mixed_precision.{k}") if mp.get(k) is not None else None)
            for k in ("param_dtype", "reduce_dtype")
        }
    if f.get("ignored_params") is not None:
        ig = f["ignored_params"]
        if isinstance(ig, str) and ig.lower() in ("4bit", "params4bit"):
            ig = "4bit"
        elif isinstance(ig, str):
            ig = [ig]
        if ig != "4bit" and not (isinstance(ig, list) and all(isinstance(x, str) for x in ig)):
            raise AuditInputError(f"{w}.ignored_params: expected \"4bit\" or a list of parameter name "
                                  f"patterns, got {f['ignored_params']!r}")
        s.ignored_params = ig
    if f.get("reshard_after_forward") is not None:
        s.reshard_after_forward = _bool(f["reshard_after_forward"], f"{w}.reshard_after_forward")
    if "shard_root" in f:
        s.shard_root = _bool(f["shard_root"], f"{w}.shard_root")
    if f.get("auto_wrap_policy") is not None:
        key = str(f["auto_wrap_policy"]).lower()
        if key not in FSDP1_POLICIES:
            raise AuditInputError(f"{w}.auto_wrap_policy: expected one of TRANSFORMER_BASED_WRAP, "
                                  f"SIZE_BASED_WRAP, NO_WRAP, peft; got {f['auto_wrap_policy']!r}")
        s.auto_wrap_policy = FSDP1_POLICIES[key]
    if "min_num_params" in f:
        s.min_num_params = _int(f["min_num_params"], f"{w}.min_num_params")
    if f.get("torch") is not None:
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?", str(f["torch"])):
            raise AuditInputError(f"{w}.torch: expected a version such as 2.6, got {f['torch']!r}")
        s.torch = str(f["torch"])
    return s


def apply_overrides(spec: AuditSpec, o: Mapping[str, Any]) -> None:
    """CLI flags win over the file. Keys: see `fsdplint.audit.cli`."""
    where = "command line"
    if o.get("trust_remote_code"):
        spec.trust_remote_code = True
    if o.get("dtype"):
        spec.dtype = normalize_dtype(o["dtype"], f"{where}: --dtype")
    if o.get("no_lora"):
        spec.lora = None
    if o.get("lora") is not None:
        val = o["lora"]
        if val == "default":
            spec.lora = spec.lora if spec.lora is not None else {}
        elif val.lstrip().startswith("{"):
            try:
                spec.lora = json.loads(val)
            except json.JSONDecodeError as e:
                raise AuditInputError(f"{where}: --lora: invalid JSON: {e.msg}") from None
            if not isinstance(spec.lora, dict):
                raise AuditInputError(f"{where}: --lora: expected a JSON object")
        else:
            spec.lora = _parse_lora(val, where, Path.cwd())
    if o.get("target_modules"):
        spec.lora = dict(spec.lora or {})
        tm = o["target_modules"]
        spec.lora["target_modules"] = tm if tm == "all-linear" else [t.strip() for t in tm.split(",") if t.strip()]
        spec.locations.setdefault("lora.target_modules", (1, 1))
    if o.get("no_autocast"):
        spec.lora = dict(spec.lora or {}, autocast_adapter_dtype=False)
    if o.get("r") is not None:
        spec.lora = dict(spec.lora or {})
        spec.lora["r"] = o["r"]
    if o.get("quant"):
        if spec.prequantized is not None:
            spec.input_notes.append(f"quantization_config ({spec.prequantized['quant_method']}) replaced by "
                                    f"--quant {o['quant']}.")
            spec.prequantized = None
        if o["quant"] == "none":
            spec.quantization = None
        else:
            keep = dict(spec.quantization or {})
            keep.pop("load_in_4bit", None)
            keep.pop("load_in_8bit", None)
            keep.update(_parse_quant(o["quant"], where))
            spec.quantization = keep
    if o.get("quant_storage"):
        if not spec.quantization:
            spec.quantization = {"load_in_4bit": True}
        spec.quantization["bnb_4bit_quant_storage"] = normalize_dtype(
            o["quant_storage"], f"{where}: --quant-storage", storage=True)
    if o.get("fsdp") is not None:
        spec.fsdp.version = int(o["fsdp"])
    if o.get("world_size") is not None:
        spec.fsdp.world_size = _world_size(o["world_size"], f"{where}: --world-size")
    if o.get("offload") is not None:
        spec.fsdp.offload_params = bool(o["offload"])
    if o.get("wrap"):
        spec.fsdp.wrap = [c.strip() for c in o["wrap"].split(",") if c.strip()]
    if o.get("use_orig_params") is not None:
        spec.fsdp.use_orig_params = bool(o["use_orig_params"])
    if o.get("gpu_memory") is not None:
        spec.gpu_memory = parse_size(o["gpu_memory"], f"{where}: --gpu-memory")
    if o.get("seq_len") is not None:
        spec.training.seq_len = _int(o["seq_len"], f"{where}: --seq-len")
    if o.get("micro_batch") is not None:
        spec.training.micro_batch = _int(o["micro_batch"], f"{where}: --micro-batch")
    if o.get("activation_checkpointing") is not None:
        spec.training.activation_checkpointing = bool(o["activation_checkpointing"])
    if o.get("adamw_fused") is not None:
        spec.training.adamw_fused = bool(o["adamw_fused"])
    if o.get("torch_version"):
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?", str(o["torch_version"])):
            raise AuditInputError(f"{where}: --torch-version: expected a version such as 2.6, "
                                  f"got {o['torch_version']!r}")
        spec.target_versions = dict(spec.target_versions, torch=str(o["torch_version"]))
