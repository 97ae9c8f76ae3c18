"""The model-audit inputs a training script fixes: LoraConfig, BitsAndBytesConfig, load dtype, FSDP.

Read with the static analysis (libcst, no torch): only literals, directly or through simple
name bindings. A setting computed at run time is recorded as unknown, with the checks that
depend on it, so the audit leaves them out instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import libcst as cst

from fsdplint.analysis import UNKNOWN, QName, ScriptAnalysis
from fsdplint.resolve import dotted

# World size when neither the script nor its launch config fixes one.
DEFAULT_WORLD_SIZE = 8

LORA_FIELDS = (
    "r", "lora_alpha", "lora_dropout", "target_modules", "target_parameters", "exclude_modules",
    "modules_to_save", "bias", "task_type", "layers_to_transform", "layers_pattern", "use_rslora", "use_dora",
    "fan_in_fan_out", "rank_pattern", "alpha_pattern", "init_lora_weights", "trainable_token_indices",
)
QUANT_FIELDS = (
    "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_storage", "bnb_4bit_compute_dtype", "bnb_4bit_quant_type",
    "bnb_4bit_use_double_quant", "llm_int8_skip_modules",
)
_DTYPES = {"float32": "float32", "float": "float32", "float16": "float16", "half": "float16",
           "bfloat16": "bfloat16", "float64": "float64", "double": "float64", "uint8": "uint8"}
_CAST_METHODS = {"bfloat16": "bfloat16", "half": "float16", "float": "float32"}
# Checks that read the shard plan: meaningless when the plan itself is a guess.
PLAN_CODES = {"FSDP002", "FSDP003", "FSDP004", "FSDP005", "FSDP006", "FSDP016", "FSDP111", "FSDP502"}
# Checks that still mean something when the script does not use FSDP at all.
NO_FSDP_CODES = {"FSDP113", "FSDP301"}


@dataclass
class ScriptSettings:
    """What the script fixes for the audit, and where (1-based row, column) each field is written."""

    lora: Optional[dict] = None
    quantization: Optional[dict] = None
    dtype: Optional[str] = None
    fsdp: Optional[dict] = None  # None: the script does not use FSDP
    autocast_adapter_dtype: bool = True
    cast_after_lora: Optional[str] = None
    world_size_assumed: bool = False
    locations: dict = field(default_factory=dict)
    skip: set = field(default_factory=set)  # codes left out because an input is not a literal
    notes: list = field(default_factory=list)


def plain(value: Any) -> Any:
    """A value the audit spec accepts (dtype names, task types as strings), or UNKNOWN."""
    if value is UNKNOWN:
        return UNKNOWN
    if isinstance(value, QName):
        head, _, last = value.name.rpartition(".")
        if head == "torch" and last in _DTYPES:
            return _DTYPES[last]
        if head.endswith("TaskType"):
            return last
        return UNKNOWN
    if isinstance(value, (list, tuple, set)):
        items = [plain(v) for v in value]
        return UNKNOWN if any(v is UNKNOWN for v in items) else items
    if isinstance(value, dict):
        out = {k: plain(v) for k, v in value.items()}
        return UNKNOWN if any(v is UNKNOWN for v in out.values()) else out
    return value


class _Extractor:
    def __init__(self, analysis: ScriptAnalysis, path: Optional[Path], versions: dict) -> None:
        self.a = analysis
        self.path = path
        self.versions = versions  # explicit/config target versions, for accelerate/transformers defaults
        self.s = ScriptSettings()
        self.nodes: dict[str, cst.CSTNode] = {}

    def run(self) -> ScriptSettings:
        gpm = self._lora()
        self._quantization()
        self._dtype()
        self._fsdp()
        if gpm is not None:
            self._cast(gpm)
        return self.s

    # -- helpers ---------------------------------------------------------------------------
    def _at(self, key: str, node: Optional[cst.CSTNode]) -> None:
        if node is not None and key not in self.nodes:
            self.nodes[key] = node

    def _kwargs(self, call, fields, section: str) -> tuple[dict, list[str]]:
        """Literal keyword arguments of `call` among `fields`; names of those that are not literal."""
        out, unknown = {}, []
        kws = self.a.keywords(call)
        if kws is None:  # an unresolved **kwargs may hold anything
            kws = {a.keyword.value: a.value for a in call.node.args if a.keyword is not None}
            unknown.append("**kwargs")
        for name, expr in kws.items():
            if name not in fields:
                continue
            arg = call.kwarg(name)
            self._at(f"{section}.{name}", arg if arg is not None else expr)
            v = plain(self.a.value(expr, call.scope))
            if v is UNKNOWN:
                unknown.append(name)
            else:
                out[name] = v
        return out, unknown

    def _version(self, package: str):
        from fsdplint.versions import resolve

        return resolve(package, self.path, self.versions.get("explicit", {}), self.versions.get("config", {}),
                       self.versions.get("config_source", "[tool.fsdplint]"))

    # -- LoRA --------------------------------------------------------------------------------
    def _lora(self):
        a = self.a
        gpms = a.calls("get_peft_model")
        config, gpm = None, gpms[0] if gpms else None
        for g in gpms:
            c = a.call_for(g.arg(1, "peft_config"), g.scope, "LoraConfig")
            if c is not None:
                config, gpm = c, g
                break
        if config is None and a.calls("LoraConfig"):
            config = a.calls("LoraConfig")[0]
        if gpm is not None:
            v = a.value(gpm.kw("autocast_adapter_dtype"), gpm.scope)
            if v is False:
                self.s.autocast_adapter_dtype = False
        if config is None:
            if gpm is not None or a.calls("inject_adapter_in_model"):
                self.s.lora = {}
                self.s.skip |= {"FSDP113", "FSDP301"}
                self.s.notes.append("the LoraConfig is not built in this script: audited with peft's default "
                                    "targets for the architecture; target checks (FSDP113, FSDP301) left out")
                self._at("lora", gpm.node if gpm is not None else None)
            return gpm
        self._at("lora", config.node)
        lora, unknown = self._kwargs(config, LORA_FIELDS, "lora")
        self.s.lora = lora
        if {"target_modules", "target_parameters", "**kwargs"} & set(unknown):
            self.s.skip |= {"FSDP113", "FSDP301"}
        if unknown:
            self.s.notes.append(f"LoraConfig {', '.join(unknown)} not a literal: left at peft's default"
                                + ("; target checks (FSDP113, FSDP301) left out" if "FSDP113" in self.s.skip else ""))
        return gpm

    def _cast(self, gpm) -> None:
        """`model.to(torch.bfloat16)` (or `.bfloat16()`) on the PEFT model before it is wrapped."""
        a = self.a
        names = {dotted(t) for t in gpm.targets} - {None}
        wraps = [c.seq for c in a.calls("FSDP1", "fully_shard") if c.scope is gpm.scope]
        for c in gpm.scope.calls:
            if c.seq <= gpm.seq or c.loops or c.receiver is None or dotted(c.receiver) not in names:
                continue
            if wraps and c.seq > min(wraps):
                break
            dtype = _CAST_METHODS.get(c.method or "")
            if c.method == "to":
                for arg in c.node.args:
                    if arg.keyword is None or arg.keyword.value == "dtype":
                        v = plain(a.value(arg.value, c.scope))
                        if isinstance(v, str) and v in _DTYPES.values():
                            dtype = v
            if dtype:
                self.s.cast_after_lora = dtype
                return

    # -- quantization and dtype -----------------------------------------------------------------
    def _loads(self):
        return self.a.calls("load_model")

    def _quantization(self) -> None:
        a = self.a
        configs = a.calls("BitsAndBytesConfig")
        config = None
        for load in self._loads():
            q = load.kw("quantization_config")
            c = a.call_for(q, load.scope, "BitsAndBytesConfig") if q is not None else None
            if c is not None:
                config = c
                break
        config = config or (configs[0] if configs else None)
        if config is None:
            for load in self._loads():  # legacy `from_pretrained(load_in_4bit=True)`
                for key in ("load_in_4bit", "load_in_8bit"):
                    if a.value(load.kw(key), load.scope) is True:
                        self.s.quantization = {key: True}
                        self._at("quantization", load.node)
                        return
            return
        self._at("quantization", config.node)
        quant, unknown = self._kwargs(config, QUANT_FIELDS, "quantization")
        if {"load_in_4bit", "load_in_8bit", "**kwargs"} & set(unknown):
            self.s.skip |= {"FSDP201", "FSDP202", "FSDP203"}
            self.s.notes.append("BitsAndBytesConfig load_in_4bit/load_in_8bit not a literal: audited "
                                "unquantized; 4-bit checks left out")
            return
        if "bnb_4bit_quant_storage" in unknown:
            self.s.skip |= {"FSDP202", "FSDP005"}
            self.s.notes.append("bnb_4bit_quant_storage not a literal: storage-dtype checks (FSDP202, FSDP005) "
                                "left out")
        if quant.get("load_in_4bit") or quant.get("load_in_8bit"):
            self.s.quantization = quant

    def _dtype(self) -> None:
        a = self.a
        loads = self._loads()
        chosen = next((ld for ld in loads if ld.kw("quantization_config") is not None), None)
        chosen = chosen or next((ld for ld in loads if ld.kw("torch_dtype") is not None or ld.kw("dtype") is not None),
                                None)
        chosen = chosen or (loads[0] if loads else None)
        if chosen is None:
            return
        self._at("dtype", chosen.node)
        key = "dtype" if chosen.kw("dtype") is not None else "torch_dtype"
        expr = chosen.kw(key)
        if expr is None:
            if chosen.method == "from_pretrained" and self._version("transformers") < "5":
                # transformers 4 loads in float32 unless told otherwise; 5 uses the config's dtype.
                self.s.dtype = "float32"
            return
        arg = chosen.kwarg(key)
        self._at("dtype", arg)
        v = plain(a.value(expr, chosen.scope))
        if v == "auto":
            return
        if v is UNKNOWN or v not in _DTYPES.values() or v == "uint8":
            self.s.skip |= {"FSDP005", "FSDP202"}
            self.s.notes.append(f"from_pretrained({key}=...) not a literal dtype: audited in the config's dtype; "
                                f"dtype checks (FSDP005, FSDP202) left out")
            return
        self.s.dtype = v

    # -- FSDP ------------------------------------------------------------------------------------
    def _fsdp(self) -> None:
        a = self.a
        launch = a.launch
        fsdp1, fsdp2 = a.calls("FSDP1"), a.calls("fully_shard")
        if fsdp2 and not fsdp1:
            version = 2
        elif fsdp1 and not fsdp2:
            version = 1
        else:
            version = getattr(launch, "fsdp_version", None) or (2 if fsdp2 else None)
        if version is None:
            self.s.notes.append("the script does not use FSDP: only the LoRA target checks ran")
            return
        f: dict[str, Any] = {"version": version}
        self.s.fsdp = f
        ws = _int(launch.value("num_processes")) if launch is not None else None
        if ws:
            f["world_size"] = ws
            node = launch.get("num_processes").node
            self._at("fsdp.world_size", node)
        else:
            self.s.world_size_assumed = True
        if version == 1:
            self._fsdp1(f, fsdp1, launch)
        else:
            self._fsdp2(f, fsdp2, launch)

    def _launch_settings(self, f: dict, launch) -> None:
        if launch is None:
            return
        classes = launch.value("transformer_layer_cls_to_wrap")
        if isinstance(classes, str):
            classes = [c.strip() for c in classes.split(",") if c.strip()]
        if isinstance(classes, list) and classes and all(isinstance(c, str) for c in classes):
            f["wrap"] = classes
        if str(launch.value("offload_params", "") or "").lower() == "true":
            f["offload_params"] = True
        for key in ("use_orig_params", "auto_wrap_policy", "min_num_params"):
            s = launch.get(key)
            if s is not None and s.node is not None:
                self._at(f"fsdp.{key}", s.node)

    def _fsdp1(self, f: dict, calls, launch) -> None:
        a = self.a
        self._launch_settings(f, launch)
        trainer = bool(a.calls("Trainer"))
        peft_policy = bool(a.calls("peft_fsdp_auto_wrap_policy"))
        if launch is not None and launch.get("use_orig_params") is not None:
            v = launch.value("use_orig_params")
            if isinstance(v, bool):
                f["use_orig_params"] = v
            elif str(v).lower() in ("true", "false"):
                f["use_orig_params"] = str(v).lower() == "true"
        if launch is not None:
            pol = str(launch.value("auto_wrap_policy", "") or "").upper()
            f["auto_wrap_policy"] = {"TRANSFORMER_BASED_WRAP": "transformer", "SIZE_BASED_WRAP": "size",
                                     "NO_WRAP": "none"}.get(pol, "transformer" if not calls else "none")
            mnp = _int(launch.value("min_num_params"))
            if mnp:
                f["min_num_params"] = mnp
        call = calls[0] if calls else None
        if call is not None:
            self._at("fsdp", call.node)
            kws = a.keywords(call)
            if kws is None:
                self.s.skip |= PLAN_CODES
                self.s.notes.append("FullyShardedDataParallel(**kwargs) not literal: plan checks left out")
                return
            if "use_orig_params" in kws:
                self._at("fsdp.use_orig_params", call.kwarg("use_orig_params"))
                v = a.value(kws["use_orig_params"], call.scope)
                if isinstance(v, bool):
                    f["use_orig_params"] = v
                else:
                    self.s.skip |= {"FSDP004", "FSDP005"}
                    self.s.notes.append("use_orig_params not a literal: FSDP004/FSDP005 left out")
            else:
                f.setdefault("use_orig_params", False)
            self._at("fsdp.wrap", call.kwarg("auto_wrap_policy"))
            policy = self._policy(kws.get("auto_wrap_policy"), call.scope, f)
            if policy is None:
                self.s.skip |= PLAN_CODES
                self.s.notes.append("the FSDP1 auto_wrap_policy is not one fsdplint can evaluate: plan checks "
                                    "left out")
                return
            f["auto_wrap_policy"] = policy
        if peft_policy or (trainer and self.s.lora is not None):
            # peft's policy (set by the script, or by the HF Trainer for PEFT models) wraps each
            # LoRA layer in its own unit.
            f["auto_wrap_policy"] = "peft"
        self._at("fsdp", _first_node(a, ("Trainer", "TrainingArguments", "FullyShardedDataParallelPlugin",
                                         "Accelerator")))

    def _policy(self, expr, scope, f: dict) -> Optional[str]:
        a = self.a
        if expr is None or a.value(expr, scope) is None:
            return "none"
        if a.call_for(expr, scope, "peft_fsdp_auto_wrap_policy") is not None:
            return "peft"
        mwp = a.call_for(expr, scope, "ModuleWrapPolicy")
        if mwp is not None:
            return self._classes(mwp.arg(0, "module_classes"), scope, f)
        partial = a.call_for(expr, scope, "functools_partial")
        if partial is not None:
            fn = partial.arg(0)
            from fsdplint.apis import api_of

            api = api_of(a.resolver.qualify(fn)) if fn is not None else None
            if api == "transformer_auto_wrap_policy":
                return self._classes(partial.kw("transformer_layer_cls"), partial.scope, f)
            if api == "size_based_auto_wrap_policy":
                n = a.value(partial.kw("min_num_params"), partial.scope) if partial.kw("min_num_params") else 100_000_000
                if not isinstance(n, int):
                    return None
                f["min_num_params"] = n
                return "size"
            return None
        from fsdplint.apis import api_of

        if api_of(a.resolver.qualify(expr)) == "size_based_auto_wrap_policy":
            return "size"
        return None

    def _classes(self, expr, scope, f: dict) -> Optional[str]:
        """Class names from `{LlamaDecoderLayer, ...}`; the model's own layer classes when not literal."""
        for _ in range(3):
            if isinstance(expr, (cst.Name, cst.Attribute)) and self.a.binding(dotted(expr) or "", scope) is not None:
                expr = self.a.binding(dotted(expr), scope)
        if isinstance(expr, (cst.Set, cst.List, cst.Tuple)):
            names = [dotted(e.value) for e in expr.elements]
            if names and all(names):
                f["wrap"] = [n.rsplit(".", 1)[-1] for n in names]
                return "transformer"
        self.s.notes.append("the FSDP1 policy's layer classes are not literal: the model's own decoder-layer "
                            "classes (_no_split_modules) were used")
        return "transformer"

    def _fsdp2(self, f: dict, calls, launch) -> None:
        a = self.a
        self._launch_settings(f, launch)
        if calls:
            self._at("fsdp", calls[0].node)
            looped = [c for c in calls if c.loops]
            self._at("fsdp.wrap", (looped or calls)[0].node)
        for c in calls:
            mp = c.kw("mp_policy")
            mpc = a.call_for(mp, c.scope, "MixedPrecisionPolicy") if mp is not None else None
            if mpc is not None and "mixed_precision" not in f:
                vals = {k: plain(a.value(mpc.kw(k), mpc.scope)) for k in ("param_dtype", "reduce_dtype")
                        if mpc.kw(k) is not None}
                if all(isinstance(v, str) for v in vals.values()):
                    f["mixed_precision"] = vals
            if c.kw("ignored_params") is not None:
                self._at("fsdp.ignored_params", c.kwarg("ignored_params"))
                f["ignored_params"] = "4bit"
                self.s.skip |= {"FSDP001", "FSDP201"}
                self.s.notes.append("fully_shard(ignored_params=...) is computed at run time: taken as the 4-bit "
                                    "base weights; FSDP001/FSDP201 left to the static checks")
        if not calls and launch is not None and self.s.quantization and self.s.quantization.get("load_in_4bit"):
            # accelerate >= 1.14 passes frozen Params4bit as ignored_params under FSDP2 (accelerate#3987).
            if self._version("accelerate") >= "1.14":
                f["ignored_params"] = "4bit"
        self._at("fsdp", _first_node(a, ("Trainer", "TrainingArguments", "FullyShardedDataParallelPlugin",
                                         "Accelerator")))


def _int(v) -> Optional[int]:
    try:
        n = int(v)
    except (TypeError, ValueError):
        return None
    return n if n >= 1 else None


def _first_node(a: ScriptAnalysis, apis) -> Optional[cst.CSTNode]:
    calls = a.calls(*apis)
    return calls[0].node if calls else None


def extract(analysis: ScriptAnalysis, path: Optional[Path] = None, versions: Optional[dict] = None,
            module: Optional[cst.Module] = None, text: str = "") -> ScriptSettings:
    """The audit inputs a script fixes, with the (row, col) of each field in `text`."""
    ex = _Extractor(analysis, path, versions or {})
    s = ex.run()
    module = module or analysis.module
    nodes = dict(ex.nodes)
    anchor = (nodes.get("fsdp") or nodes.get("lora") or nodes.get("quantization") or nodes.get("dtype"))
    for key in ("lora", "quantization", "fsdp", "dtype", "gpu_memory"):
        if key not in nodes and anchor is not None:
            nodes[key] = anchor
    if nodes:
        from fsdplint.positions import Positions

        pos = Positions(module, text or module.code, analysis.c.top if module is analysis.module else None)
        for key, node in nodes.items():
            start, _ = pos.range(node)
            s.locations[key] = (start.row, start.column)
    return s
