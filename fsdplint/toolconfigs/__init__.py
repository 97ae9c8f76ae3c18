"""Training-tool configs (axolotl, LLaMA-Factory) read as jobs.

Many QLoRA + FSDP jobs have no training code of their own: the job is a YAML file for a tool
that builds the model, the quantization config, the adapter and the FSDP plugin from it. A
reader per tool turns such a file — recognised by its content, whatever its name — into a `Job`:
what the tool will build at run time (4-bit or 8-bit base and the storage dtype the tool gives
it, adapter and LoRA targets, device_map, FSDP version and settings), each value with the YAML
line it was written on. What the tool does itself (e.g. axolotl sets a float quant storage for
QLoRA + FSDP; LLaMA-Factory refuses 8-bit under FSDP) is encoded per tool version in the
readers and `defaults.py`, so the rules report only what the tool does not catch.

The rules check a job through `ctx.options["job"]` (see `Job.gate`), and its FSDP settings as
ordinary launch facts (`fsdplint.launch.LaunchFacts`), so the existing launch checks apply too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from fsdplint.launch import LaunchFacts, Setting

TOOLS = ("axolotl", "llamafactory")
TOOL_NAMES = {"axolotl": "axolotl", "llamafactory": "LLaMA-Factory"}


@dataclass(frozen=True)
class Gate:
    """Whether the tool, at the job's version, lets a failure through.

    affected: True (the version is known and has the problem), False (the tool handles it: stay
    silent), None (the tool's version is unknown: the finding becomes a warning that says what
    to declare). `why` says what the tool does, with the version it was read at."""

    affected: Optional[bool]
    why: str = ""
    declare: str = ""

    def suffix(self) -> str:
        if self.affected is None and self.declare:
            return f" ({self.why}; declare the {self.declare} version, e.g. a requirements pin, to decide)"
        return f" ({self.why})" if self.why else ""


@dataclass
class Quant:
    bits: int
    setting: Setting  # where 4-bit / 8-bit is asked for
    # The bnb_4bit_quant_storage the tool passes (dtype name), None: the uint8 default.
    storage: Optional[str] = None
    storage_setting: Optional[Setting] = None
    model_dtype: Optional[str] = None  # the dtype the tool loads the model with


@dataclass
class Job:
    tool: str
    filename: str
    text: str
    values: dict[str, Setting] = field(default_factory=dict)  # top-level keys (and "fsdp_config.<key>")
    tool_version: Any = None  # versions.TargetVersion, or None when unknown
    model: Optional[Setting] = None
    family: Optional[str] = None  # architecture family for LoRA target names (rules/_module_names.py)
    family_source: str = ""
    adapter: Optional[Setting] = None
    quant: Optional[Quant] = None
    lora_targets: Optional[list[str]] = None  # None: unknown or every linear layer
    targets_setting: Optional[Setting] = None
    device_map: Optional[Setting] = None
    launch: Optional[LaunchFacts] = None  # FSDP settings; None: no FSDP
    fsdp_version_why: str = ""
    # Rule code -> what the tool does about that failure at this version (absent: nothing).
    gates: dict[str, Gate] = field(default_factory=dict)
    # Rule code -> what to change in this tool's config (the rules' own advice is for scripts).
    remedy: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return TOOL_NAMES[self.tool]

    @property
    def fsdp_version(self) -> Optional[int]:
        return self.launch.fsdp_version if self.launch is not None else None

    def get(self, key: str) -> Optional[Setting]:
        return self.values.get(key)

    def value(self, key: str, default: Any = None) -> Any:
        s = self.values.get(key)
        return s.value if s is not None else default

    def gate(self, code: str) -> Gate:
        return self.gates.get(code, Gate(True))

    def version_text(self) -> str:
        tv = self.tool_version
        return tv.describe() if tv is not None else f"{self.name} version unknown"


def yaml_tree(text: str, filename: str):
    """The YAML mapping node of `text`, or None (not YAML, not a mapping)."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    return root if isinstance(root, yaml.MappingNode) else None


def mapping_values(node, filename: str, prefix: str = "") -> dict[str, Setting]:
    """Top-level keys of a mapping node as Settings (value constructed, line of the key);
    nested mappings also give "<key>.<subkey>" entries."""
    import yaml

    loader = yaml.SafeLoader("")
    out: dict[str, Setting] = {}
    for knode, vnode in node.value:
        key = f"{prefix}{knode.value}"
        try:
            value = loader.construct_object(vnode, deep=True)
        except yaml.YAMLError:
            value = getattr(vnode, "value", None)
        out[key] = Setting(key, value, filename, knode.start_mark.line + 1)
        if isinstance(vnode, yaml.MappingNode) and not prefix:
            out.update(mapping_values(vnode, filename, f"{key}."))
    return out


def recognise(text: str, filename: str) -> Optional[str]:
    """"axolotl" / "llamafactory" when the YAML text is such a config (by its keys), else None."""
    if "base_model" not in text and "model_name_or_path" not in text:
        return None  # cheap pre-filter: both tools name the model with one of these keys
    root = yaml_tree(text, filename)
    if root is None:
        return None
    keys = {str(k.value) for k, _ in root.value}
    from fsdplint.toolconfigs import axolotl, llamafactory

    if axolotl.looks_like(keys):
        return "axolotl"
    if llamafactory.looks_like(keys):
        return "llamafactory"
    return None


def read_job(text: str, filename: str, *, path: Optional[Path] = None, explicit: Optional[dict] = None,
             use_installed: bool = True, versions: Optional[dict] = None) -> Optional[Job]:
    """The job a tool config describes, or None when `text` is no tool config.

    `versions`: resolved library versions by package (TargetVersion) for version-dependent
    tool behaviour (e.g. transformers/bitsandbytes for LLaMA-Factory's quant storage)."""
    tool = recognise(text, filename)
    if tool is None:
        return None
    values = mapping_values(yaml_tree(text, filename), filename)
    return job_from_values(tool, filename, text, values, path=path, explicit=explicit,
                           use_installed=use_installed, versions=versions)


def job_from_values(tool: str, filename: str, text: str, values: dict[str, Setting], *, path: Optional[Path] = None,
                    explicit: Optional[dict] = None, use_installed: bool = True,
                    versions: Optional[dict] = None) -> Job:
    """The job for a tool from its settings by key (as a YAML file or a launcher's `--key value`
    flags give them; nested keys as "fsdp_config.<key>"), each with the file and line it came from."""
    from fsdplint.toolconfigs import axolotl, llamafactory
    from fsdplint.toolconfigs.defaults import tool_version

    tv = tool_version(tool, path, explicit or {}, use_installed)
    reader = axolotl if tool == "axolotl" else llamafactory
    job = Job(tool, filename, text, dict(values), tv)
    reader.fill(job, versions or {}, path)
    return job


def family_of(model_id: Any, model_class: Any = None, config_dir: Optional[Path] = None) -> tuple[Optional[str], str]:
    """Architecture family from a local config.json, a model class name (LlamaForCausalLM) or a
    well-known hub id; (None, "") when unsure (then LoRA target names are not checked)."""
    import json
    import re

    from fsdplint.rules._lora_targets import _MODEL_IDS, _MODEL_TYPES
    from fsdplint.rules._module_names import FAMILIES

    if isinstance(model_id, str) and config_dir is not None:
        local = Path(model_id)
        if not local.is_absolute():
            local = config_dir / local
        cfg = local / "config.json"
        if cfg.is_file():
            try:
                mt = str(json.loads(cfg.read_text(encoding="utf-8")).get("model_type", "")).lower()
            except (OSError, ValueError, AttributeError):
                mt = ""
            fam = _MODEL_TYPES.get(mt, mt)
            if fam in FAMILIES:
                return fam, str(cfg)
    if isinstance(model_class, str):
        m = re.fullmatch(r"([A-Za-z0-9]+)For[A-Za-z]+", model_class.strip())
        if m and m.group(1).lower() != "auto":
            stem = m.group(1).lower()
            by_flat = {f.replace("_", ""): f for f in FAMILIES}
            fam = by_flat.get(stem)
            if fam is not None:
                return fam, model_class.strip()
    if isinstance(model_id, str):
        for pat, fam in _MODEL_IDS:
            if re.search(pat, model_id.lower()):
                return fam, model_id
    return None, ""


def dtype_name(v: Any) -> Optional[str]:
    """"bf16"/"bfloat16"/"torch.bfloat16" -> "bfloat16"; None when unknown."""
    if not isinstance(v, str):
        return None
    name = v.strip().lower().removeprefix("torch.")
    return {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16",
            "fp32": "float32", "float32": "float32", "float": "float32"}.get(name)
