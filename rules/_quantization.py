"""4-bit configs built by a library function rather than a `BitsAndBytesConfig(...)` the script writes.

trl's `get_quantization_config(model_args)` returns `BitsAndBytesConfig(load_in_4bit=True, ...)` when the
parsed `ModelConfig` has `load_in_4bit`, with `bnb_4bit_quant_storage` taken from a field that depends on
the trl release (apis.RETURNED_CONFIGS). The flags come from the command line or a recipe, so
the script's own text says nothing about 4-bit: only the argument analysis does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fsdplint import behaviour
from fsdplint.apis import RETURNED_CONFIGS
from fsdplint.analysis import UNKNOWN
from fsdplint.collect import Call
from fsdplint.resolve import dotted


@dataclass
class LibraryQuant:
    call: Call  # the library call
    storage: Any  # the storage dtype name, None for bitsandbytes' default (uint8), UNKNOWN when not known

    @property
    def node(self):
        return self.call.node


def trl_4bit_configs(ctx, a) -> list[LibraryQuant]:
    """`get_quantization_config(args)` calls whose arguments are known to ask for 4 bits."""
    env = getattr(a, "env", None)
    if env is None:
        return []
    out = []
    for call in a.calls("trl_get_quantization_config"):
        arg = call.arg(0, "model_args") or call.arg(0, "model_config")
        ns = dotted(arg) if arg is not None else None
        if not ns or "." in ns:
            continue
        hit = env.lookup(f"{ns}.load_in_4bit")
        if hit is None or hit.single is not True:
            continue
        field = storage_field(ctx.version("trl"))
        if field is None:
            storage = UNKNOWN
        elif field == "":
            storage = None
        else:
            v = env.lookup(f"{ns}.{field}")
            storage = UNKNOWN if v is None else v.single
        out.append(LibraryQuant(call, storage))
    return out


def storage_field(trl) -> "str | None":
    """The ModelConfig field trl's get_quantization_config takes bnb_4bit_quant_storage from at this trl
    version: "" when it passes none (uint8), None when the version is unknown."""
    for key, fields in RETURNED_CONFIGS["trl_get_quantization_config"][2]:
        held = behaviour.holds(key, trl)
        if held is None:
            return None
        if held:
            source = fields["bnb_4bit_quant_storage"]
            return "" if source == ("absent",) else source[1]
    return ""
