"""The records a timeline is made of: steps, events, references, and the union-find over model names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Union

import libcst as cst

from fsdplint.collect import AttrSet, Call
from fsdplint.unknown import UNKNOWN  # noqa: F401  (re-exported: the analysis' name for it)

if TYPE_CHECKING:  # pragma: no cover
    from fsdplint.analysis.timeline import Timeline

# Calls that return the model they were given (so their result is the same model).
SAME_MODEL_APIS = {
    "get_peft_model": (0, "model"),
    "FSDP1": (0, "module"),
    "fully_shard": (0, "module"),
    "DDP": (0, "module"),
    "prepare_model_for_kbit_training": (0, "model"),
    "PeftModel_from_pretrained": (0, "model"),
    "torch_compile": (0, "model"),
    # Composer's HuggingFaceModel(model, tokenizer) keeps the model as `self.model` and trains it as it is.
    "composer_HuggingFaceModel": (0, "model"),
}
SAME_MODEL_METHODS = {"to", "cuda", "half", "bfloat16", "float", "requires_grad_", "train", "eval", "to_empty"}


@dataclass(frozen=True)
class QName:
    """A dotted reference that is not a literal, e.g. `torch.bfloat16`."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Ref:
    key: str
    child: bool  # a submodule of the model (a layer), not the model itself
    path: tuple[str, ...] = ()


Item = Union[Call, AttrSet]


@dataclass
class Step:
    item: Item
    prefix: str
    mapping: dict[str, str]
    returns: list[str] = field(default_factory=list)  # keys returned by an inlined helper
    # Position in the timeline (execution order); `seq` is the source order, which differs for inlined helpers.
    order: int = -1
    # For code of another module of the project (analysis/index.py): that module, and the call in the
    # linted file through which it runs (where findings about it are reported).
    origin: Any = None
    site: Optional[Call] = None

    @property
    def seq(self) -> int:
        return self.item.seq

    @property
    def call(self) -> Optional[Call]:
        return self.item if isinstance(self.item, Call) else None

    def key(self, name: str) -> str:
        if name in self.mapping:
            return self.mapping[name]
        root, dot, rest = name.partition(".")
        if root in ("self", "cls"):
            # A method inlined on an object of the caller: its `self` is that object.
            base = self.mapping.get(root)
            return base + dot + rest if base is not None else name
        return self.prefix + name


@dataclass
class Event:
    kind: str
    step: Step
    ref: Optional[Ref]
    data: dict = field(default_factory=dict)
    timeline: Optional["Timeline"] = None

    @property
    def call(self) -> Optional[Call]:
        return self.step.call

    @property
    def node(self) -> cst.CSTNode:
        return self.step.item.node if isinstance(self.step.item, Call) else self.step.item.value

    @property
    def seq(self) -> int:
        """Execution order within the timeline (a helper defined below its caller still runs at the call)."""
        return self.step.order if self.step.order >= 0 else self.step.seq

    @property
    def entity(self) -> Optional[str]:
        return self.timeline.find(self.ref.key) if (self.ref and self.timeline) else None


class UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, k: str) -> str:
        p = self.parent.setdefault(k, k)
        while p != self.parent.setdefault(p, p):
            p = self.parent[p]
        self.parent[k] = p
        return p

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb

