"""4-bit configs built by a library function rather than a `BitsAndBytesConfig(...)` the script writes.

trl's `get_quantization_config(model_args)` returns `BitsAndBytesConfig(load_in_4bit=True, ...)` when
`model_args.load_in_4bit`, with `bnb_4bit_quant_storage` taken from a field that depends on the trl release
(apis.RETURNED_CONFIGS). The flags come from the command line, a recipe or a dataclass default, so the
script's own text says nothing about 4-bit: only the value analysis does. One reader for FSDP201 and FSDP202.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import libcst as cst

from fsdplint import behaviour
from fsdplint.apis import RETURNED_CONFIGS
from fsdplint.analysis import UNKNOWN
from fsdplint.collect import Call
from fsdplint.resolve import dotted


@dataclass
class LibraryQuant:
    call: Call  # the library call
    storage: Any  # the storage dtype's value, None for bitsandbytes' default (uint8), UNKNOWN when not known
    behaviour: Optional[str]  # the behaviour.py entry for the target release (None: the release is unknown)
    field: Optional[str]  # the argument's field the storage comes from (None: none is passed)

    @property
    def node(self):
        return self.call.node


def library_4bit_configs(ctx, a) -> list[LibraryQuant]:
    """Calls of the library functions of apis.RETURNED_CONFIGS that build a BitsAndBytesConfig and whose
    argument's values ask for 4 bits, with the storage the target release of that library gives it."""
    out = []
    for api, (kind, fields, by_version) in RETURNED_CONFIGS.items():
        if kind != "BitsAndBytesConfig":
            continue
        for call in a.calls(api):
            source = dotted(call.arg(0, "model_args") or call.arg(0, "model_config"))
            if source is None:
                continue

            def read(spec, source=source, call=call):
                return a.value(cst.parse_expression(f"{source}.{spec[1]}"), call.scope)

            if read(fields["load_in_4bit"]) is not True:
                continue
            chosen = next(((key, f) for key, f in by_version
                           if behaviour.holds(key, ctx.version(behaviour.BEHAVIOURS[key].package))), None)
            if chosen is None:  # the release is unknown: which storage it sets cannot be told
                out.append(LibraryQuant(call, UNKNOWN, None, None))
                continue
            key, f = chosen
            spec = f["bnb_4bit_quant_storage"]
            if spec[0] == "absent":
                out.append(LibraryQuant(call, None, key, None))
            else:
                out.append(LibraryQuant(call, read(spec), key, spec[1]))
    return out
