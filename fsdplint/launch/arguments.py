"""What a script's command-line arguments hold: argparse, HfArgumentParser/TrlParser dataclasses, recipe files.

`parse_definitions` reads the script (with `ast`, never running it): `add_argument(...)` calls
(type, default, action, choices, dest, nargs), `HfArgumentParser((ModelArguments, TrainingArguments))`
/ `TrlParser(...)` with the script's own dataclasses and the library ones, and the names the parsed
results are bound to (`args = parser.parse_args()`, `model_args, training_args =
parser.parse_args_into_dataclasses()`). The library dataclasses' fields are read from the installed
library's source file (found with `importlib.util.find_spec`, parsed, not imported), else from the
table below. `bind` applies a launch's arguments (and the recipe YAML/JSON they name) to those
definitions: every field gets its possible values and where each was set.
"""

from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from fsdplint.launch import configfiles
from fsdplint.unknown import UNKNOWN

_PARSERS = ("HfArgumentParser", "TrlParser", "H4ArgumentParser")
_PARSE_METHODS = {"parse_args_into_dataclasses", "parse_args_and_config", "parse", "parse_yaml_file",
                  "parse_json_file", "parse_dict"}
# Library dataclasses: qualified name -> (distribution, file inside the package, class).
LIBRARY_CLASSES = {
    "transformers.TrainingArguments": ("transformers", "training_args.py", "TrainingArguments"),
    "transformers.Seq2SeqTrainingArguments": ("transformers", "training_args_seq2seq.py", "Seq2SeqTrainingArguments"),
    "trl.SFTConfig": ("trl", "trainer/sft_config.py", "SFTConfig"),
    "trl.DPOConfig": ("trl", "trainer/dpo_config.py", "DPOConfig"),
    "trl.GRPOConfig": ("trl", "trainer/grpo_config.py", "GRPOConfig"),
    "trl.ModelConfig": ("trl", "trainer/model_config.py", "ModelConfig"),
    "trl.ScriptArguments": ("trl", "scripts/utils.py", "ScriptArguments"),
    "alignment.ModelArguments": ("alignment", "configs.py", "ModelArguments"),
    "alignment.SFTConfig": ("alignment", "configs.py", "SFTConfig"),
    "alignment.DPOConfig": ("alignment", "configs.py", "DPOConfig"),
}
_ALIASES = {"transformers.training_args.TrainingArguments": "transformers.TrainingArguments",
            "trl.trainer.SFTConfig": "trl.SFTConfig", "trl.trainer.sft_config.SFTConfig": "trl.SFTConfig",
            "trl.trainer.ModelConfig": "trl.ModelConfig", "trl.trainer.model_config.ModelConfig": "trl.ModelConfig",
            "trl.scripts.utils.ScriptArguments": "trl.ScriptArguments", "trl.TrlParser": "trl.TrlParser",
            "alignment.configs.ModelArguments": "alignment.ModelArguments",
            "alignment.configs.SFTConfig": "alignment.SFTConfig", "alignment.configs.DPOConfig": "alignment.DPOConfig"}
# Used when the library's source is not installed: the fields the rules read, with their types and
# defaults, as of the versions in SHIPPED_VERSIONS (transformers training_args.py; trl trainer/model_config.py,
# trainer/base_config.py, scripts/utils.py; alignment-handbook src/alignment/configs.py).
SHIPPED_VERSIONS = {"transformers": "5.24.0", "trl": "1.10.0.dev0", "alignment-handbook": "0.4.0.dev0"}
_TRAINING = {
    "output_dir": ("str", None), "fsdp": ("str", None), "fsdp_config": ("str", None),
    "gradient_checkpointing": ("bool", None), "gradient_checkpointing_kwargs": ("str", None),
    "bf16": ("bool", False), "fp16": ("bool", False), "ddp_find_unused_parameters": ("bool", None),
    "torch_compile": ("bool", False), "per_device_train_batch_size": ("int", 8), "learning_rate": ("float", 5e-05),
    "num_train_epochs": ("float", 3.0), "max_steps": ("int", -1), "seed": ("int", 42),
    "gradient_accumulation_steps": ("int", 1), "deepspeed": ("str", None), "report_to": ("str", None),
}
_TRL_BASE = {**_TRAINING, "gradient_checkpointing": ("bool", True), "bf16": ("bool", None)}
SHIPPED = {
    "transformers.TrainingArguments": _TRAINING,
    "transformers.Seq2SeqTrainingArguments": _TRAINING,
    "trl.SFTConfig": _TRL_BASE, "trl.DPOConfig": _TRL_BASE, "trl.GRPOConfig": _TRL_BASE,
    "trl.ModelConfig": {
        "model_name_or_path": ("str", None), "model_revision": ("str", "main"), "dtype": ("str", "float32"),
        "attn_implementation": ("str", None), "use_peft": ("bool", False), "lora_r": ("int", 16),
        "lora_alpha": ("int", 32), "lora_dropout": ("float", 0.05), "lora_target_modules": ("list", None),
        "lora_target_parameters": ("list", None), "lora_modules_to_save": ("list", None),
        "lora_task_type": ("str", "CAUSAL_LM"), "use_rslora": ("bool", False), "use_dora": ("bool", False),
        "load_in_8bit": ("bool", False), "load_in_4bit": ("bool", False), "bnb_4bit_quant_type": ("str", "nf4"),
        "use_bnb_nested_quant": ("bool", False), "bnb_4bit_quant_storage": ("str", None),
        "trust_remote_code": ("bool", False), "torch_dtype": ("str", None),
    },
    "trl.ScriptArguments": {
        "dataset_name": ("str", None), "dataset_config": ("str", None), "dataset_train_split": ("str", "train"),
        "dataset_test_split": ("str", "test"), "dataset_streaming": ("bool", False),
    },
    "alignment.ModelArguments": {
        "model_name_or_path": ("str", None), "model_revision": ("str", "main"), "torch_dtype": ("str", None),
        "trust_remote_code": ("bool", False), "use_flash_attention_2": ("bool", False), "use_peft": ("bool", False),
        "lora_r": ("int", 16), "lora_alpha": ("int", 32), "lora_dropout": ("float", 0.05),
        "lora_target_modules": ("list", None), "lora_modules_to_save": ("list", None),
        "load_in_8bit": ("bool", False), "load_in_4bit": ("bool", False), "bnb_4bit_quant_type": ("str", "nf4"),
        "use_bnb_nested_quant": ("bool", False),
    },
    "alignment.SFTConfig": _TRAINING, "alignment.DPOConfig": _TRAINING,
}
TRAINING_FAMILY = {"transformers.TrainingArguments", "transformers.Seq2SeqTrainingArguments", "trl.SFTConfig",
                   "trl.DPOConfig", "trl.GRPOConfig", "alignment.SFTConfig", "alignment.DPOConfig"}


@dataclass
class Field:
    name: str  # dest: the attribute name
    options: list[str]  # option strings ("--load_in_4bit", "-q"); empty for positionals
    kind: str = "str"  # bool, str, int, float, list, other
    default: Any = None
    action: Optional[str] = None  # store_true, store_false, store_const, count, append, bool_optional, hf_bool
    const: Any = None
    choices: Optional[tuple] = None
    nargs: Any = None
    line: int = 0  # where the argument or field is defined in the script (0: a library)
    bool_type: bool = False  # `type=str2bool`-style helper: a word read as true or false

    def switch(self) -> Optional[tuple[str, Any]]:
        """(option string, the value passing it gives) for an opt-in flag: an option whose default leaves a
        feature off and which a user passes to switch it on (`store_true`, a bool dataclass field defaulting
        to False/None, `type=str` defaulting to "False"); None for options with another domain."""
        if not self.options or self.choices is not None:
            return None
        flag, d = self.options[0], self.default
        if self.action == "store_true" or self.action == "bool_optional" or (
                self.kind == "bool" and self.action in (None, "hf_bool")):
            return (flag, True) if d in (False, None) else None
        if self.action == "store_false":
            return (flag, False) if d is True else None
        if self.kind == "pybool" or self.bool_type:
            return (flag, True) if d in (False, None, "False", "false") else None
        if self.kind == "str" and self.action is None and d in ("False", "false", False):
            return (flag, "True" if d != "false" else "true")
        return None


@dataclass
class Group:
    """The fields one parsed object has: an argparse namespace or one dataclass."""

    kind: str  # "argparse" or a dataclass name (qualified for library ones)
    fields: dict[str, Field] = field(default_factory=dict)
    training: bool = False  # a TrainingArguments-family dataclass


@dataclass
class Definitions:
    groups: list[Group] = field(default_factory=list)
    namespaces: dict[str, Group] = field(default_factory=dict)  # variable name -> its group
    config_flag: bool = False  # TrlParser.parse_args_and_config: `--config recipe.yaml`
    file_arg: bool = False  # parse_yaml_file/parse_json_file/H4 parse: the first argument may be a recipe
    recipe: Optional[str] = None  # `parse_yaml_file("recipe.yaml")` with the path written in the script
    fire: bool = False  # `fire.Fire(main)`: the command line's `--key value` words, as fire reads them
    # Config objects built from a file the launch names (`cfg = OmegaConf.load(args.config)`, see configfiles).
    configs: list = field(default_factory=list)


@dataclass(frozen=True)
class Origin:
    file: str
    line: int
    what: str  # "default", "launch", "recipe"

    def describe(self) -> str:
        if self.what == "default":
            return f"its default, line {self.line}" if self.line else "its default"
        return f"set by {self.file}:{self.line}"


@dataclass
class ArgValue:
    values: tuple  # possible values (UNKNOWN among them when not all are known)
    origin: Optional[Origin] = None
    # An opt-in flag left at its default (or freed, see `bind`): the option string that switches it on.
    switch: Optional[str] = None

    @property
    def single(self) -> Any:
        return self.values[0] if len(self.values) == 1 else UNKNOWN


@dataclass
class ArgEnv:
    """The values of a script's parsed arguments under one launch (or under the defaults)."""

    names: dict[str, dict[str, ArgValue]] = field(default_factory=dict)  # namespace var -> field -> value
    training: list[tuple[str, ArgValue]] = field(default_factory=list)  # TrainingArguments fields set explicitly
    texts: dict[str, str] = field(default_factory=dict)  # recipe files read, for source lines
    switches: dict[str, Any] = field(default_factory=dict)  # opt-in flag -> the value passing it gives
    # Config variables read from a file (their keys dotted: `peft.q_lora`) -> whether a key the file lacks is
    # absent (a plain mapping) rather than filled by defaults that are not read (a dataclass config).
    configs: dict[str, bool] = field(default_factory=dict)

    def lookup(self, dotted: Optional[str]) -> Optional[ArgValue]:
        if not dotted or "." not in dotted:
            return None
        ns, attr = dotted.split(".", 1)
        group = self.names.get(ns)
        if group is None or ("." in attr and ns not in self.configs):
            return None
        return group.get(attr, ArgValue((UNKNOWN,)))

    def absent(self, dotted: Optional[str]) -> bool:
        """`cfg.key` names a key a complete config file lacks (so `cfg.get(key, default)` gives the default)."""
        if not dotted or "." not in dotted:
            return False
        ns, attr = dotted.split(".", 1)
        group = self.names.get(ns)
        if group is None or not self.configs.get(ns) or attr in group:
            return False
        # A key under an overridden or unknown parent is not known to be absent.
        parts = attr.split(".")
        return all(_is_mapping_value(group.get(".".join(parts[:i]))) for i in range(1, len(parts)))


def _is_mapping_value(v: Optional[ArgValue]) -> bool:
    return v is not None and len(v.values) == 1 and isinstance(v.values[0], dict)


# -- reading the script -------------------------------------------------------------------
def might_parse_arguments(text: str) -> bool:
    return "add_argument" in text or any(p in text for p in _PARSERS) or "Fire(" in text or configfiles.might_load(text)


def parse_definitions(source: str, use_installed: bool = True, find_module=None,
                      path: Optional[Path] = None) -> Optional[Definitions]:
    """The script's argument definitions; None when it parses none. `find_module(importer, module, level)`
    (the project's import resolution) lets dataclasses defined in the project's other modules
    (`from alignment import ModelArguments`, a `src/` package) be read from their own file."""
    if not might_parse_arguments(source):
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    nodes = list(ast.walk(tree))  # one walk; the passes below filter it
    imports = _imports(nodes)
    classes = {n.name: n for n in nodes if isinstance(n, ast.ClassDef)}
    stars = [(n.module or "", n.level) for n in nodes
             if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)]
    project = (find_module, path, stars) if find_module is not None and path is not None else None
    defs = Definitions()
    argparse_group = Group("argparse")
    parser_vars: dict[str, list[Group]] = {}
    functions = [n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    returns_parse: set[str] = set()
    for r in nodes:
        if isinstance(r, ast.Return) and isinstance(r.value, ast.Call) and _method(r.value) in (
                {"parse_args", "parse_known_args"} | _PARSE_METHODS):
            around = [f for f in functions if f.lineno <= r.lineno <= (f.end_lineno or f.lineno)]
            if around:
                returns_parse.add(max(around, key=lambda f: f.lineno).name)
    for node in nodes:
        if isinstance(node, ast.Call) and _method(node) == "add_argument":
            f = _argparse_field(node)
            if f is not None:
                argparse_group.fields.setdefault(f.name, f)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            call = node.value
            callee = _name(call.func)
            types = _parser_types(call) if callee and callee.split(".")[-1] in _PARSERS else None
            if types is not None:
                groups = [_dataclass_group(t, classes, imports, use_installed, project) for t in types]
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        parser_vars[t.id] = groups
                defs.groups.extend(g for g in groups if g is not None)
    if argparse_group.fields:
        defs.groups.insert(0, argparse_group)
    for node in nodes:
        # `args = parser.parse_args_into_dataclasses()[0]`: the one dataclass at that index.
        index = None
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript) \
                and isinstance(node.value.value, ast.Call) and isinstance(node.value.slice, ast.Constant) \
                and isinstance(node.value.slice.value, int) and not isinstance(node.value.slice.value, bool):
            index = node.value.slice.value
            node = ast.Assign(targets=node.targets, value=node.value.value)
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        call = node.value
        m = _method(call)
        receiver = _name(call.func.value) if isinstance(call.func, ast.Attribute) else None
        if m in ("parse_args", "parse_known_args") and receiver not in parser_vars:
            if argparse_group.fields:
                for t in node.targets:
                    name = _first_name(t)
                    if name:
                        defs.namespaces[name] = argparse_group
        elif m in _PARSE_METHODS or (m in ("parse_args", "parse_known_args") and receiver in parser_vars):
            groups = parser_vars.get(receiver or "")
            inner = call.func.value if isinstance(call.func, ast.Attribute) else None
            types = _parser_types(inner) if isinstance(inner, ast.Call) and (
                _name(inner.func) or "").split(".")[-1] in _PARSERS else None
            if groups is None and types is not None:
                # `HfArgumentParser(Args).parse_json_file(...)`
                groups = [_dataclass_group(t, classes, imports, use_installed, project) for t in types]
                defs.groups.extend(g for g in groups if g is not None)
            if groups is None:
                continue
            if m == "parse_args_and_config":
                defs.config_flag = True
            if m in ("parse_yaml_file", "parse_json_file", "parse"):
                path = call.args[0] if call.args else None
                if isinstance(path, ast.Constant) and isinstance(path.value, str):
                    defs.recipe = path.value
                else:
                    defs.file_arg = True
            for t in node.targets:
                names = [e.id if isinstance(e, ast.Name) else None for e in t.elts] if isinstance(t, (ast.Tuple, ast.List)) \
                    else [t.id if isinstance(t, ast.Name) else None]
                if index is not None:
                    groups = groups[index:index + 1] if 0 <= index < len(groups) else []
                for name, g in zip(names, groups):
                    if name and g is not None:
                        defs.namespaces[name] = g
        elif isinstance(call.func, ast.Name) and call.func.id in returns_parse and argparse_group.fields:
            for t in node.targets:
                name = _first_name(t)
                if name:
                    defs.namespaces.setdefault(name, argparse_group)
    if not defs.namespaces and "Fire(" in source:
        _fire_definitions(nodes, functions, classes, imports, use_installed, project, defs)
    for var in _trainer_args(nodes):
        # `Trainer(args=x)` / `SFTTrainer(model, x)`: x is a TrainingArguments (or a subclass) even when its
        # class cannot be read (an unknown import, a project subclass of one): the launch's `--fsdp ...`
        # words are its fields.
        g = defs.namespaces.get(var)
        if g is not None and g is not argparse_group and not g.training:
            g.training = True
            for name, f in (library_fields("transformers.TrainingArguments", use_installed) or {}).items():
                g.fields.setdefault(name, f)
    if configfiles.might_load(source):
        defs.configs = configfiles.find_loads(nodes, imports, lambda n: _qualify(n, imports), defs.namespaces)
    # `def main(args)` called with a parsed namespace: the parameter holds the same fields.
    return defs if defs.namespaces or defs.configs else None


def _trainer_args(nodes) -> set[str]:
    """Names passed as a trainer's training arguments: `args=` of a `...Trainer(...)` call, or its second
    positional argument (`Trainer(model, args)`)."""
    out = set()
    for n in nodes:
        if not isinstance(n, ast.Call) or not (_name(n.func) or "").rsplit(".", 1)[-1].endswith("Trainer"):
            continue
        arg = next((k.value for k in n.keywords if k.arg == "args"), None)
        if arg is None and len(n.args) >= 2 and not any(isinstance(a, ast.Starred) for a in n.args[:2]):
            arg = n.args[1]
        if isinstance(arg, ast.Name):
            out.add(arg.id)
    return out


def _parser_types(call: ast.Call) -> Optional[list]:
    """The dataclass expressions an `HfArgumentParser(...)`/`TrlParser(...)` call is given, positionally or
    as `dataclass_types=`, one class or a tuple/list of them; None when it is given none."""
    arg = call.args[0] if call.args and not isinstance(call.args[0], ast.Starred) else next(
        (k.value for k in call.keywords if k.arg == "dataclass_types"), None)
    if arg is None:
        return None
    return list(arg.elts) if isinstance(arg, (ast.Tuple, ast.List)) else [arg]


def _fire_definitions(nodes, functions, classes, imports, use_installed, project, defs: Definitions) -> None:
    """`fire.Fire(main)` with `def main(**kwargs)` that builds config dataclasses and hands them the
    keywords (`train_config = TRAIN_CONFIG(); update_config(train_config, **kwargs)`, the llama-recipes
    layout): each such variable holds its dataclass's fields, set by the launch's `--key value` words."""
    target = None
    for n in nodes:
        if isinstance(n, ast.Call) and (_name(n.func) or "").split(".")[-1] == "Fire" and n.args \
                and _qualify(_name(n.func) or "", imports) in ("fire.Fire", "fire.core.Fire") \
                and isinstance(n.args[0], ast.Name):
            target = n.args[0].id
    fn = next((f for f in functions if f.name == target), None)
    if fn is None or fn.args.kwarg is None:
        return
    kwargs = fn.args.kwarg.arg
    built: dict[str, ast.AST] = {}  # variable -> the class it is built from
    for n in ast.walk(fn):
        if not isinstance(n, ast.Assign) or len(n.targets) != 1:
            continue
        t, v = n.targets[0], n.value
        pairs = list(zip(t.elts, v.elts)) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) \
            and len(t.elts) == len(v.elts) else [(t, v)]
        for tt, vv in pairs:
            if isinstance(tt, ast.Name) and isinstance(vv, ast.Call) and not vv.args and not vv.keywords:
                built[tt.id] = vv.func
    handed: set[str] = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == kwargs
                                           for k in n.keywords):
            for a in n.args:
                for e in (a.elts if isinstance(a, (ast.Tuple, ast.List)) else [a]):
                    if isinstance(e, ast.Name) and e.id in built:
                        handed.add(e.id)
    for var in sorted(handed):
        g = _dataclass_group(built[var], classes, imports, use_installed, project)
        if g is not None and g.fields:
            defs.groups.append(g)
            defs.namespaces[var] = g
    defs.fire = bool(defs.namespaces)


def fire_value(text: str) -> Any:
    """A command-line word as fire (0.7, parser.DefaultParseValue) reads it: a Python literal, with bare
    names taken as strings (`false` is the string "false", only `False` is False), else the text itself."""
    try:
        root = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return text
    if isinstance(root.body, ast.BinOp):
        return text

    class _Bare(ast.NodeTransformer):
        def visit_Name(self, node):
            return node if node.id in ("True", "False", "None") else ast.copy_location(ast.Constant(node.id), node)

    try:
        return ast.literal_eval(_Bare().visit(root))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return text


def _first_name(t: ast.AST) -> Optional[str]:
    if isinstance(t, ast.Name):
        return t.id
    if isinstance(t, (ast.Tuple, ast.List)) and t.elts and isinstance(t.elts[0], ast.Name):
        return t.elts[0].id
    return None


def _method(call: ast.Call) -> Optional[str]:
    return call.func.attr if isinstance(call.func, ast.Attribute) else None


def _name(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _imports(nodes) -> dict[str, str]:
    out = {}
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.ImportFrom) and node.level:  # `from .config import configs`: ".config.configs"
            for a in node.names:
                if a.name != "*":
                    out[a.asname or a.name] = "." * node.level + (f"{node.module}." if node.module else "") + a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    return out


def _qualify(name: str, imports: dict[str, str]) -> str:
    head, _, rest = name.partition(".")
    full = imports.get(head, head) + (f".{rest}" if rest else "")
    return _ALIASES.get(full, full)


def _literal(node: Optional[ast.AST]) -> Any:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return UNKNOWN


def _kind_of_type(node: Optional[ast.AST]) -> str:
    n = _name(node) if node is not None else None
    return {"int": "int", "float": "float", "str": "str", "bool": "pybool"}.get(n or "", "other" if n else "str")


def _argparse_field(call: ast.Call) -> Optional[Field]:
    opts = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if not opts or len(opts) != len(call.args):
        return None
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = kw.get("action")
    action_name = action.value if isinstance(action, ast.Constant) else (
        "bool_optional" if action is not None and (_name(action) or "").endswith("BooleanOptionalAction") else
        ("other" if action is not None else None))
    if "dest" in kw and isinstance(kw["dest"], ast.Constant):
        dest = kw["dest"].value
    else:
        longs = [o for o in opts if o.startswith("--")]
        dest = (longs[0] if longs else opts[0]).lstrip("-").replace("-", "_")
    positional = not opts[0].startswith("-")
    f = Field(dest, [] if positional else opts, _kind_of_type(kw.get("type")), None, action_name,
              line=call.lineno)
    f.bool_type = f.kind == "other" and "bool" in (_name(kw.get("type")) or "").rsplit(".", 1)[-1].lower()
    if action_name in ("store_true", "store_false", "bool_optional"):
        f.kind = "bool"
        f.default = action_name == "store_false" if "default" not in kw else _literal(kw["default"])
        if action_name == "bool_optional" and "default" not in kw:
            f.default = None
    elif "default" in kw:
        f.default = _literal(kw["default"])
    if action_name == "store_const":
        f.const = _literal(kw.get("const"))
    if "choices" in kw:
        ch = _literal(kw["choices"])
        f.choices = tuple(ch) if isinstance(ch, (list, tuple, set)) else None
    if "nargs" in kw:
        f.nargs = _literal(kw["nargs"])
    if action_name in ("count", "append", "other"):
        f.kind = "other"
    return f


def _dataclass_group(node: ast.AST, classes, imports, use_installed: bool, project=None) -> Optional[Group]:
    name = _name(node)
    if name is None:
        return None
    if "." not in name and name in classes:
        fields = _class_fields(classes[name], classes, imports, use_installed, 0, local=True)
        g = Group(name, fields)
        g.training = _is_training(classes[name], classes, imports)
        return g
    head, _, rest = name.partition(".")
    raw = imports.get(head, head) + (f".{rest}" if rest else "")
    level = len(raw) - len(raw.lstrip("."))
    raw = raw[level:]
    if project is not None and raw.split(".")[0] not in _LIBRARY_PACKAGES:
        # A dataclass of the project's own modules (`Args`, `configs.Args`, `pkg.configs.Args`, imported
        # absolutely, relatively or by `from configs import *`): its fields as that file defines them.
        module, _, cls_name = raw.rpartition(".")
        found = _project_class(module, level, cls_name, project[1], project[0]) if module or level else None
        if found is None and head not in imports and head not in classes:
            found = next((hit for mod, lvl in project[2] for hit in [
                _project_class(mod, lvl, name, project[1], project[0], star=True)] if "." not in name and hit), None)
        if found is not None:
            cls, tree = found
            nodes = list(ast.walk(tree))
            mod_classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
            mod_imports = _imports(nodes)
            fields = _class_fields(cls, mod_classes, mod_imports, use_installed, 0, local=True, lines=False)
            return Group(raw, fields, _is_training(cls, mod_classes, mod_imports))
    qual = _qualify(name, imports)
    fields = library_fields(qual, use_installed)
    if fields is None:
        return Group(qual, {}, qual in TRAINING_FAMILY)
    return Group(qual, fields, qual in TRAINING_FAMILY)


def _is_training(cls: ast.ClassDef, classes, imports, depth: int = 0) -> bool:
    for b in cls.bases:
        n = _name(b)
        if n is None or depth > 4:
            continue
        if "." not in n and n in classes:
            if _is_training(classes[n], classes, imports, depth + 1):
                return True
        elif _qualify(n, imports) in TRAINING_FAMILY:
            return True
    return False


def _class_fields(cls: ast.ClassDef, classes, imports, use_installed, depth, local, lines: bool = True) -> dict[str, Field]:
    """`lines=False`: a class of another file, whose lines are not the script's."""
    out: dict[str, Field] = {}
    for b in cls.bases:
        n = _name(b)
        if n is None or depth > 4:
            continue
        if "." not in n and n in classes:
            out.update(_class_fields(classes[n], classes, imports, use_installed, depth + 1, local, lines))
        else:
            lib = library_fields(_qualify(n, imports), use_installed) if local else None
            if lib:
                out.update(lib)
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            f = _dataclass_field(stmt, local and lines)
            if f is not None:
                out[f.name] = f
    return out


# Packages whose dataclasses are read from the installed library (or the table), never from the project.
_LIBRARY_PACKAGES = frozenset({"transformers", "trl", "peft", "accelerate", "torch", "datasets"})
_TREES: dict[tuple, Optional[ast.Module]] = {}


def _module_tree(path: Path) -> Optional[ast.Module]:
    try:
        st = path.stat()
        key = (str(path), st.st_mtime_ns, st.st_size)
    except OSError:
        return None
    if key not in _TREES:
        try:
            _TREES[key] = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
            _TREES[key] = None
    return _TREES[key]


def _project_class(module: str, level: int, name: str, importer: Path, find_module,
                   depth: int = 0, star: bool = False) -> Optional[tuple[ast.ClassDef, ast.Module]]:
    """The class `name` of the project module `module` (following re-exports such as a package
    `__init__.py`'s `from .configs import ModelArguments` or `from .configs import *`); None when it is not
    the project's. `star`: reached through `from module import *`, which binds only what `__all__` lists
    (without one, the public names)."""
    if depth > 3:
        return None
    try:
        f = find_module(importer, module, level)
    except (OSError, ValueError):
        return None
    tree = _module_tree(f) if f is not None else None
    if tree is None or f == importer:
        return None
    if star:
        from fsdplint.module_exports import dunder_all

        public = dunder_all(tree.body)
        if (name not in public) if public is not None else name.startswith("_"):
            return None
    for n in tree.body:
        if isinstance(n, ast.ClassDef) and n.name == name:
            return n, tree
    for n in tree.body:
        if isinstance(n, ast.ImportFrom):
            for a in n.names:
                if (a.asname or a.name) == name:
                    return _project_class(n.module or "", n.level, a.name, f, find_module, depth + 1)
    for n in tree.body:
        if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names):
            hit = _project_class(n.module or "", n.level, name, f, find_module, depth + 1, star=True)
            if hit is not None:
                return hit
    return None


def _annotation_kind(node: ast.AST) -> str:
    text = ast.unparse(node) if node is not None else ""
    text = text.replace("typing.", "")
    if re.search(r"\b(list|List|tuple|Tuple)\b", text):
        return "list"
    m = re.fullmatch(r"(?:Optional\[(\w+)\]|(\w+)(?:\s*\|\s*None)?|Union\[(\w+),\s*None\])", text)
    base = next((g for g in m.groups() if g), "") if m else ""
    return {"bool": "hf_bool", "int": "int", "float": "float", "str": "str"}.get(base, "str" if "str" in text else "other")


def _dataclass_field(stmt: ast.AnnAssign, local: bool) -> Optional[Field]:
    name = stmt.target.id
    if name.startswith("_") or "ClassVar" in ast.unparse(stmt.annotation):
        return None
    default: Any = None
    value = stmt.value
    choices = None
    if isinstance(value, ast.Call) and (_name(value.func) or "").split(".")[-1] == "field":
        kw = {k.arg: k.value for k in value.keywords if k.arg}
        if "default" in kw:
            default = _literal(kw["default"])
        elif "default_factory" in kw:
            fac = kw["default_factory"]
            default = [] if _name(fac) == "list" else UNKNOWN
            if isinstance(fac, ast.Lambda):
                default = _literal(fac.body)
        meta = _literal(kw.get("metadata")) if "metadata" in kw else None
        if isinstance(meta, dict) and isinstance(meta.get("choices"), (list, tuple)):
            choices = tuple(meta["choices"])
    elif value is not None:
        default = _literal(value)
    kind = _annotation_kind(stmt.annotation)
    opts = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    f = Field(name, opts, "bool" if kind == "hf_bool" else kind, default, "hf_bool" if kind == "hf_bool" else None,
              choices=choices, line=stmt.lineno if local else 0)
    if kind == "list":
        f.nargs = "+"
    return f


# -- library dataclasses --------------------------------------------------------------------
_LIB_CACHE: dict[tuple, Optional[dict]] = {}


def library_fields(qual: str, use_installed: bool = True) -> Optional[dict[str, Field]]:
    """Fields of a library dataclass: from its installed source (parsed, not imported), else the table."""
    qual = _ALIASES.get(qual, qual)
    key = (qual, use_installed)
    if key in _LIB_CACHE:
        return _LIB_CACHE[key]
    fields = _installed_fields(qual) if use_installed else None
    if fields is None and qual in SHIPPED:
        fields = {}
        for name, (kind, default) in SHIPPED[qual].items():
            opts = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
            fields[name] = Field(name, opts, kind, default, "hf_bool" if kind == "bool" else None,
                                 nargs="+" if kind == "list" else None)
    _LIB_CACHE[key] = fields
    return fields


def _package_dir(dist: str) -> Optional[Path]:
    import importlib.util

    try:
        spec = importlib.util.find_spec(dist)  # a top-level name: nothing is imported
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _installed_fields(qual: str, depth: int = 0) -> Optional[dict[str, Field]]:
    entry = LIBRARY_CLASSES.get(qual)
    if entry is None or depth > 4:
        return None
    dist, rel, cls_name = entry
    root = _package_dir(dist)
    if root is None:
        return None
    return _fields_in_file(root, root / rel, cls_name, depth)


def _fields_in_file(root: Path, path: Path, cls_name: str, depth: int) -> Optional[dict[str, Field]]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    if cls is None:
        return None
    out: dict[str, Field] = {}
    for b in cls.bases:
        n = _name(b)
        if n is None:
            continue
        base = _base_location(root, path, tree, n)
        if base is not None:
            got = _fields_in_file(root, base[0], base[1], depth + 1)
            if got:
                out.update(got)
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            f = _dataclass_field(stmt, local=False)
            if f is not None:
                out[f.name] = f
    return out


def _base_location(root: Path, path: Path, tree: ast.Module, name: str) -> Optional[tuple[Path, str]]:
    if any(isinstance(n, ast.ClassDef) and n.name == name for n in tree.body):
        return path, name
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if (a.asname or a.name) != name:
                    continue
                if node.level:
                    base = path.parent
                    for _ in range(node.level - 1):
                        base = base.parent
                    mod = base.joinpath(*(node.module or "").split(".")) if node.module else base
                else:
                    qual = _ALIASES.get(f"{node.module}.{a.name}", f"{node.module}.{a.name}")
                    entry = LIBRARY_CLASSES.get(qual)
                    if entry is None:
                        return None
                    pkg = _package_dir(entry[0])
                    return (pkg / entry[1], entry[2]) if pkg is not None else None
                for cand in (mod.with_suffix(".py"), mod / "__init__.py"):
                    if cand.is_file():
                        return cand, a.name
    return None


# -- applying a launch ------------------------------------------------------------------------
_TRUE = {"true", "t", "yes", "y", "1", "on"}
_FALSE = {"false", "f", "no", "n", "0", "off"}


def _convert(f: Field, text: str) -> Any:
    if f.kind in ("bool",):
        low = text.lower()
        return True if low in _TRUE else False if low in _FALSE else UNKNOWN
    if f.kind == "pybool":
        return bool(text)  # argparse's type=bool: any non-empty string is True
    if f.kind == "int":
        try:
            return int(text)
        except ValueError:
            return UNKNOWN
    if f.kind == "float":
        try:
            return float(text)
        except ValueError:
            return UNKNOWN
    if f.kind == "other":
        return UNKNOWN
    return text


def bind(defs: Definitions, launch=None, base_dirs: tuple = (), free: frozenset = frozenset()) -> ArgEnv:
    """Each namespace's fields: from the launch's words, a recipe file they name, else the defaults.
    An opt-in flag the launch leaves at its default keeps its option string (`ArgValue.switch`); those
    named in `free` may hold either value (the script run with them passed, or not)."""
    env = ArgEnv()
    values: dict[int, dict[str, ArgValue]] = {}
    for g in defs.groups:
        values[id(g)] = {name: ArgValue((f.default,), Origin("", f.line, "default")) for name, f in g.fields.items()}
    if launch is not None:
        words = list(launch.args)
        recipe = None
        if defs.config_flag:
            for k, w in enumerate(words):
                if w.text == "--config" and k + 1 < len(words):
                    recipe = words[k + 1]
                    del words[k:k + 2]
                    break
                if w.text.startswith("--config="):
                    recipe = type(w)(w.text.split("=", 1)[1], w.line, w.unknown)
                    del words[k]
                    break
        elif defs.file_arg and words and words[0].text.endswith((".yaml", ".yml", ".json")):
            recipe = words.pop(0)
        if recipe is None and getattr(launch, "recipe", None):
            recipe = _word(launch.recipe)  # a candidate launch: the lone recipe's values
        if recipe is None and defs.recipe is not None:
            recipe = _word(defs.recipe)
        if recipe is not None:
            _apply_recipe(defs, values, recipe, base_dirs, env)
        if defs.fire:
            _apply_fire_words(defs, values, words, launch)
        else:
            _apply_words(defs, values, words, launch)
        if launch.open_args:
            for g in defs.groups:
                for name, v in values[id(g)].items():
                    if v.origin is None or v.origin.what == "default":
                        values[id(g)][name] = ArgValue(v.values + (UNKNOWN,) if UNKNOWN not in v.values else v.values, v.origin)
    elif defs.recipe is not None:
        _apply_recipe(defs, values, _word(defs.recipe), base_dirs, env)
    for g in defs.groups:
        for name, f in g.fields.items():
            v = values[id(g)][name]
            sw = f.switch() if v.origin is not None and v.origin.what == "default" else None
            if sw is not None:
                v.switch = sw[0]
                env.switches[sw[0]] = sw[1]
                if sw[0] in free and sw[1] not in v.values:
                    v.values = v.values + (sw[1],)
    for var, g in defs.namespaces.items():
        env.names[var] = values[id(g)]
    if defs.configs:
        configfiles.bind_loads(defs.configs, lambda ns, f: env.names.get(ns, {}).get(f), launch, base_dirs, env,
                               (ArgValue, Origin, resolve_file))
    for g in defs.groups:
        if g.training:
            for name, v in values[id(g)].items():
                if v.origin is not None and v.origin.what != "default":
                    env.training.append((name, v))
    return env


def _word(text: str):
    from fsdplint.launch.shell import Word

    return Word(text, 0)


def _owner(defs: Definitions, opt: str) -> Optional[tuple[Group, Field, Optional[bool]]]:
    """The field an option string sets, and the value its bare form means (True, or False for --no_x)."""
    for g in defs.groups:
        for f in g.fields.values():
            if opt in f.options:
                return g, f, None
    if opt.startswith("--no_") or opt.startswith("--no-"):
        name = opt[5:].replace("-", "_")
        for g in defs.groups:
            f = g.fields.get(name)
            if f is not None and f.action == "hf_bool" and f.default is True:
                return g, f, False
    return None


def _apply_words(defs, values, words, launch) -> None:
    file = launch.file
    positionals = [f for g in defs.groups for f in g.fields.values() if not f.options]
    pos_groups = {id(f): g for g in defs.groups for f in g.fields.values() if not f.options}
    k = 0
    while k < len(words):
        w = words[k]
        if w.splat or (w.unknown and not w.text.startswith("-")):
            k += 1
            continue
        text = w.text
        if not text.startswith("-") or text == "-":
            if positionals:
                f = positionals.pop(0)
                values[id(pos_groups[id(f)])][f.name] = ArgValue((_convert(f, text) if not w.unknown else UNKNOWN,),
                                                               Origin(file, w.line, "launch"))
            k += 1
            continue
        opt, inline = (text.split("=", 1) + [None])[:2] if "=" in text else (text, None)
        hit = _owner(defs, opt)
        if hit is None:
            k += 1
            continue
        g, f, bare = hit
        origin = Origin(file, w.line, "launch")
        slot = values[id(g)]
        takes_value = f.action not in ("store_true", "store_false", "store_const", "count", "bool_optional")
        if bare is False:
            slot[f.name] = ArgValue((False,), origin)
            k += 1
            continue
        if f.action in ("store_true", "store_false"):
            slot[f.name] = ArgValue((f.action == "store_true",), origin)
        elif f.action == "bool_optional":
            slot[f.name] = ArgValue((not opt.startswith("--no"),), origin)
        elif f.action == "store_const":
            slot[f.name] = ArgValue((f.const,), origin)
        elif f.action in ("count", "other"):
            slot[f.name] = ArgValue((UNKNOWN,), origin)
        elif takes_value:
            if inline is not None:
                slot[f.name] = ArgValue((_convert(f, inline) if not w.unknown else UNKNOWN,), origin)
            elif f.nargs in ("+", "*") or (isinstance(f.nargs, int) and f.nargs > 1):
                items = []
                j = k + 1
                while j < len(words) and not words[j].text.startswith("-") and not words[j].splat:
                    items.append(_convert(f, words[j].text) if not words[j].unknown else UNKNOWN)
                    j += 1
                slot[f.name] = ArgValue((items if UNKNOWN not in items else UNKNOWN,), origin)
                k = j
                continue
            elif k + 1 < len(words) and not words[k + 1].splat and (
                    not words[k + 1].text.startswith("--") or f.action != "hf_bool"):
                nxt = words[k + 1]
                if f.action == "hf_bool" and nxt.text.lower() not in _TRUE | _FALSE:
                    slot[f.name] = ArgValue((True,), origin)  # `--flag` then the next option's value
                    k += 1
                    continue
                slot[f.name] = ArgValue((_convert(f, nxt.text) if not nxt.unknown else UNKNOWN,), Origin(file, w.line, "launch"))
                k += 2
                continue
            elif f.action == "hf_bool":
                slot[f.name] = ArgValue((True,), origin)
            else:
                slot[f.name] = ArgValue((UNKNOWN,), origin)
        k += 1


def _apply_fire_words(defs, values, words, launch) -> None:
    """fire's keyword parsing (core._ParseKeywordArgs): `--key=value`; `--key value`; a bare `--key` (the
    last word, or followed by another flag) is True, `--nokey` then False. Every config that has the
    field receives it (the kwargs go to each of them)."""
    def is_flag(w) -> bool:
        return w.text.startswith("-") and not _is_number(w.text)

    k = 0
    while k < len(words):
        w = words[k]
        if w.splat or not is_flag(w):
            k += 1
            continue
        body = w.text.lstrip("-")
        inline = "=" in body
        key, value = body.split("=", 1) if inline else (body, None)
        key = key.replace("-", "_")
        bare = not inline and (k + 1 == len(words) or is_flag(words[k + 1]) or words[k + 1].splat)
        unknown = w.unknown
        if bare:
            if not any(key in values[id(g)] for g in defs.groups) and key.startswith("no"):
                key, parsed = key[2:], False
            else:
                parsed = True
            k += 1
        elif inline:
            parsed = fire_value(value)
            k += 1
        else:
            nxt = words[k + 1]
            parsed, unknown = fire_value(nxt.text), unknown or nxt.unknown
            k += 2
        for g in defs.groups:
            if key in values[id(g)]:
                values[id(g)][key] = ArgValue((UNKNOWN if unknown else parsed,), Origin(launch.file, w.line, "launch"))


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def resolve_file(name: str, base_dirs: tuple) -> Optional[Path]:
    p = Path(name)
    if p.is_absolute():
        return p if p.is_file() else None
    for d in base_dirs:
        cand = Path(d) / p
        if cand.is_file():
            return cand
    return None


def _apply_recipe(defs, values, word, base_dirs, env: ArgEnv) -> None:
    """A recipe YAML/JSON (`--config recipe.yaml`, or the first argument): its keys set the fields."""
    path = resolve_file(word.text, base_dirs) if not word.unknown else None
    if path is None:
        return
    items = read_mapping(path)
    if items is None:
        return
    display = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else str(path)
    try:
        env.texts[display] = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    for key, (value, line) in items.items():
        for g in defs.groups:
            f = g.fields.get(key)
            if f is not None:
                if f.kind == "bool" and isinstance(value, str):
                    value = _convert(f, value)
                values[id(g)][key] = ArgValue((value,), Origin(display, line, "recipe"))


def read_mapping(path: Path) -> Optional[dict[str, tuple[Any, int]]]:
    """Top-level keys of a YAML or JSON mapping file -> (value, 1-based line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        lines = text.splitlines()
        out = {}
        for k, v in data.items():
            row = next((i + 1 for i, ln in enumerate(lines) if f'"{k}"' in ln), 1)
            out[str(k)] = (v, row)
        return out
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    if not isinstance(root, yaml.MappingNode):
        return None
    loader = yaml.SafeLoader("")
    out = {}
    for knode, vnode in root.value:
        try:
            v = loader.construct_object(vnode, deep=True)
        except yaml.YAMLError:
            v = UNKNOWN
        out[str(knode.value)] = (v, knode.start_mark.line + 1)
    return out
