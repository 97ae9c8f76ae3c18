"""A training-tool job: what the tool will build, each value with its YAML line."""


from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from fsdplint.launch.settings import LaunchFacts, Setting

TOOL_NAMES = {"axolotl": "axolotl", "llamafactory": "LLaMA-Factory", "oumi": "Oumi", "recipe": "the trl recipe"}


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
        """The text appended to a finding's message."""
        if self.affected is None and self.declare:
            why = self.why[:1].upper() + self.why[1:]
            return f". {why}: declare the {self.declare} version (e.g. a requirements pin) to decide"
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
    # What the job names as its model: (hub id or local path, model class name, the config's folder);
    # the rules read the architecture family from it (rules/_lora_targets.family_of).
    model_ref: tuple = (None, None, None)
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
    """The YAML mapping node of `text`, or None (not YAML, not a mapping). Composed once per text: discovery,
    recognition and reading all ask for the same file's tree (callers only read it)."""
    return _yaml_tree(text)


@lru_cache(maxsize=16)
def _yaml_tree(text: str):
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


def dtype_name(v: Any) -> Optional[str]:
    """"bf16"/"bfloat16"/"torch.bfloat16" -> "bfloat16"; None when unknown."""
    if not isinstance(v, str):
        return None
    name = v.strip().lower().removeprefix("torch.")
    return {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16",
            "fp32": "float32", "float32": "float32", "float": "float32"}.get(name)
