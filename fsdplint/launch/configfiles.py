"""Config objects a script builds from a file the launch names, and the `key=value` overrides it merges.

Many jobs keep their settings in a YAML/JSON file and pass only its path on the command line:
`cfg = OmegaConf.load(args.config)`, `yaml.safe_load(open(args.config))`, `json.load(...)`, a dataclass
config built by a class method (`TrainingConfig.from_yaml(args.config)`,
`from_yaml_and_arg_list(config_path, unknown_args)`), or torchtune's `@config.parse` recipe entry point
(`--config FILE key=value ...`). The code then reads the nested values by attribute, key or
`.get(key, default)`: `cfg.peft.q_lora`, `cfg["training"]["bf16"]`, `cfg.get("dtype", "bf16")`.

`find_loads` reads the script (with `ast`) for the variables such a call is bound to and where its path
comes from (a parsed argument, directly, through a local variable, or through a helper that returns it in
a tuple); `bind_loads` reads the file the launch names, applies the dotted command-line overrides
(OmegaConf's dotlist: `peft.q_lora=true`, `+new.key=1`) and gives each variable its flattened keys
(`peft.q_lora`) as argument values (`fsdplint.launch.arguments.ArgEnv`).

A mapping read straight from the file (OmegaConf.load, yaml, json, torchtune's parse) is complete: a key it
lacks is absent, so `.get(key, default)` gives the default. A config built by a class method fills absent
keys from its dataclass defaults, which are not read here: such a key stays unknown.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from fsdplint.unknown import UNKNOWN

# Calls that read a mapping from a file path (qualified through the script's imports).
_FILE_LOADS = {"omegaconf.OmegaConf.load", "yaml.safe_load", "yaml.load", "yaml.full_load", "yaml.unsafe_load",
               "json.load", "json.loads"}
# Calls that wrap or merge configs without changing where the values come from.
_WRAPS = {"omegaconf.OmegaConf.merge", "omegaconf.OmegaConf.to_object", "omegaconf.OmegaConf.to_container",
          "omegaconf.OmegaConf.structured", "omegaconf.OmegaConf.create"}
# Class methods of a config class that build it from a file (its dataclass defaults fill absent keys).
_CLASS_LOADS = re.compile(r"^(from_(yaml|yml|json|file|config_file)\w*|load_(yaml|json|config)\w*)$")
_OPEN_READS = {"open", "io.open", "pathlib.Path", "Path", "pathlib.Path.read_text", "Path.read_text"}
# torchtune's recipe entry point: `@config.parse def recipe_main(cfg: DictConfig)`.
_PARSE_DECORATORS = {"torchtune.config.parse", "torchtune.config._parse.parse"}
_DOTTED_KEY = re.compile(r"^\+{0,2}[A-Za-z_][\w]*(\.[A-Za-z_0-9][\w]*)*=")


@dataclass(frozen=True)
class ConfigLoad:
    var: str  # the variable (or parameter) the config object is bound to
    namespace: Optional[str]  # the parsed namespace whose field holds the path (None: `option`)
    field: Optional[str]  # that field
    option: Optional[str]  # a launch option that names the file itself (torchtune's `--config`)
    overrides: bool  # the launch's `key=value` words override the file's values
    complete: bool  # read straight from the file: a key it lacks is absent (see the module doc)
    line: int


# -- reading the script --------------------------------------------------------------------------------------
def might_load(source: str) -> bool:
    return any(w in source for w in ("OmegaConf", "yaml", "json.load", "config.parse", "from_yaml", "from_json",
                                     "from_file", "load_config", "load_yaml"))


def find_loads(nodes: list, imports: dict, qualify, namespaces: dict) -> list[ConfigLoad]:
    """The config objects the script builds from a file whose path is a parsed argument (or a launch option)."""
    functions = {n.name: n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assigns: dict[str, list[ast.AST]] = {}
    for n in nodes:
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    assigns.setdefault(t.id, []).append(n.value)
                elif isinstance(t, (ast.Tuple, ast.List)):
                    for i, e in enumerate(t.elts):
                        if isinstance(e, ast.Name):
                            assigns.setdefault(e.id, []).append(("item", n.value, i))
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None:
            assigns.setdefault(n.target.id, []).append(n.value)
        elif isinstance(n, (ast.With, ast.AsyncWith)):  # `with open(args.config) as f: cfg = yaml.safe_load(f)`
            for item in n.items:
                if isinstance(item.optional_vars, ast.Name):
                    assigns.setdefault(item.optional_vars.id, []).append(item.context_expr)
    rest_names = {e.id for n in nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                  and isinstance(n.value.func, ast.Attribute) and n.value.func.attr == "parse_known_args"
                  for t in n.targets if isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == 2
                  for e in t.elts[1:] if isinstance(e, ast.Name)}
    ctx = _Context(functions, assigns, namespaces, rest_names, qualify)
    from_cli = any(isinstance(n, ast.Attribute) and n.attr in ("from_cli", "from_dotlist") for n in nodes)
    out: list[ConfigLoad] = []
    for n in nodes:
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and isinstance(n.value, ast.Call):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            found = ctx.load(n.value, 0)
            if found is None:
                continue
            (ns, fld), complete, rest = found
            for t in targets:
                if isinstance(t, ast.Name) and ns is not None:
                    out.append(ConfigLoad(t.id, ns, fld, None, rest or from_cli, complete, n.lineno))
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.args.args:
            if any(qualify(_dotted(d) or "") in _PARSE_DECORATORS for d in n.decorator_list):
                out.append(ConfigLoad(n.args.args[0].arg, None, None, "--config", True, True, n.lineno))
    return out


class _Context:
    def __init__(self, functions, assigns, namespaces, rest_names, qualify):
        self.functions, self.assigns, self.namespaces = functions, assigns, namespaces
        self.rest_names, self.qualify = rest_names, qualify

    def load(self, call: ast.Call, depth: int):
        """((namespace, field) of the path, complete, takes the command line's rest) for a config load."""
        if depth > 4:
            return None
        q = self.qualify(_dotted(call.func) or "")
        method = call.func.attr if isinstance(call.func, ast.Attribute) else None
        args = list(call.args) + [k.value for k in call.keywords]
        if q in _FILE_LOADS or (method and _CLASS_LOADS.match(method) and q not in _WRAPS):
            complete = q in _FILE_LOADS
            src = next((s for s in (self.path_source(a, 0) for a in args[:1] or args) if s is not None), None)
            if src is None:
                return None
            return src, complete, any(self.is_rest(a, 0) for a in args[1:])
        if q in _WRAPS:
            parts = [self.load_of(a, depth) for a in args]
            hits = [p for p in parts if p is not None]
            if len(hits) != 1:
                return None
            src, complete, rest = hits[0]
            # `OmegaConf.merge(OmegaConf.structured(Cls), OmegaConf.load(p))`: a class's defaults fill the rest.
            typed = any(isinstance(a, ast.Call) and self.qualify(_dotted(a.func) or "").endswith(".structured")
                        for a in args)
            return src, complete and not typed, rest or any(
                isinstance(a, ast.Call) and (_dotted(a.func) or "").endswith(("from_cli", "from_dotlist"))
                for a in args)
        return None

    def load_of(self, node, depth):
        if isinstance(node, ast.Call):
            return self.load(node, depth + 1)
        if isinstance(node, ast.Name):
            for v in self.assigns.get(node.id, []):
                if isinstance(v, ast.Call):
                    hit = self.load(v, depth + 1)
                    if hit is not None:
                        return hit
        return None

    def path_source(self, node, depth) -> Optional[tuple[str, str]]:
        """The parsed argument (namespace, field) an expression holding a file path (or an open file) reads."""
        if depth > 5 or node is None:
            return None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.namespaces:
            return node.value.id, node.attr
        if isinstance(node, ast.Call):
            q = self.qualify(_dotted(node.func) or "")
            if q in _OPEN_READS or (isinstance(node.func, ast.Attribute) and node.func.attr in ("read_text", "read")):
                inner = node.args[0] if node.args else (node.func.value if isinstance(node.func, ast.Attribute) else None)
                return self.path_source(inner, depth + 1)
            return None
        if isinstance(node, ast.Name):
            for v in self.assigns.get(node.id, []):
                src = self._bound_source(v, depth)
                if src is not None:
                    return src
        return None

    def _bound_source(self, v, depth):
        if isinstance(v, tuple):  # (`item`, call, index): unpacked from a call's returned tuple
            _, call, index = v
            fn = self.functions.get(_dotted(call.func) or "") if isinstance(call, ast.Call) else None
            for r in ast.walk(fn) if fn is not None else ():
                if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple) and index < len(r.value.elts):
                    src = self.path_source(r.value.elts[index], depth + 1)
                    if src is not None:
                        return src
            return None
        return self.path_source(v, depth + 1)

    def is_rest(self, node, depth) -> bool:
        """The arguments argparse left over (`args, rest = parser.parse_known_args()`), however passed on."""
        if depth > 5:
            return False
        if isinstance(node, ast.Name):
            if node.id in self.rest_names:
                return True
            for v in self.assigns.get(node.id, []):
                if isinstance(v, tuple):
                    _, call, index = v
                    fn = self.functions.get(_dotted(call.func) or "") if isinstance(call, ast.Call) else None
                    for r in ast.walk(fn) if fn is not None else ():
                        if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple) and index < len(r.value.elts) \
                                and self.is_rest(r.value.elts[index], depth + 1):
                            return True
                elif self.is_rest(v, depth + 1):
                    return True
            return False
        if isinstance(node, ast.Subscript):  # `sys.argv[1:]`
            return _dotted(node.value) == "sys.argv"
        if isinstance(node, ast.Call):
            return any(self.is_rest(a, depth + 1) for a in node.args)
        return False


def _dotted(node) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


# -- applying a launch ---------------------------------------------------------------------------------------
def read_nested(path: Path) -> Optional[dict[str, tuple[Any, int]]]:
    """Every key of a YAML/JSON mapping file, nested ones dotted (`peft.q_lora`) -> (value, 1-based line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # (JSON is YAML too: one reader for both)
    except yaml.YAMLError:
        return None
    if not isinstance(root, yaml.MappingNode):
        return None
    loader = yaml.SafeLoader("")
    out: dict[str, tuple[Any, int]] = {}

    def walk(node, prefix: str) -> None:
        for knode, vnode in node.value:
            key = f"{prefix}{knode.value}"
            try:
                v = loader.construct_object(vnode, deep=True)
            except yaml.YAMLError:
                v = UNKNOWN
            out[key] = (v, knode.start_mark.line + 1)
            if isinstance(vnode, yaml.MappingNode):
                walk(vnode, key + ".")

    try:
        walk(root, "")
    except (AttributeError, TypeError, RecursionError):
        return None
    return out


def _override_value(text: str) -> Any:
    """An override's value as OmegaConf reads a dotlist item: YAML (`true`, `1e-4`, `[a, b]`, `bfloat16`)."""
    import yaml

    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def bind_loads(loads: list[ConfigLoad], values_of, launch, base_dirs: tuple, env, binding) -> None:
    """Give each config variable the values of the file its load reads under `launch`, with the overrides.
    `values_of(namespace, field)` is the bound `ArgValue` of a parsed argument. `binding` is the argument
    binder's (ArgValue, Origin, resolve_file): passed in, since that module is the one that calls this."""
    ArgValue, Origin, resolve_file = binding

    for load in loads:
        word = None
        if load.namespace is not None:
            v = values_of(load.namespace, load.field)
            if v is None or len(v.values) != 1 or not isinstance(v.values[0], str):
                continue
            word = v.values[0]
        elif launch is not None and load.option:
            word = _option_value(launch.args, load.option)
        if not word:
            continue
        path = resolve_file(word, base_dirs)
        if path is None:
            continue
        items = read_nested(path)
        if items is None:
            continue
        rel = os.path.relpath(path)
        display = rel if not rel.startswith("..") else str(path)
        try:
            env.texts[display] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            pass
        group = {k: ArgValue((v,), Origin(display, line, "recipe")) for k, (v, line) in items.items()}
        complete = load.complete
        if launch is not None and load.overrides:
            for w in launch.args:
                if w.splat or w.text.startswith("-") or not _DOTTED_KEY.match(w.text):
                    continue
                key, value = w.text.split("=", 1)
                key = key.lstrip("+")
                for k in [k for k in group if k.startswith(key + ".")]:
                    del group[k]  # a whole sub-config replaced
                group[key] = ArgValue((UNKNOWN if w.unknown else _override_value(value),),
                                      Origin(launch.file, w.line, "launch"))
            # `"$@"`, or a word whose key cannot be read: any key may be set on the command line. (A word whose
            # value alone is unknown, `"training.run_name=${RUN}"`, sets only its own key.)
            if any(w.splat or (w.unknown and not _DOTTED_KEY.match(w.text)) for w in launch.args):
                complete = False
                group = {k: ArgValue(v.values + (UNKNOWN,) if UNKNOWN not in v.values else v.values, v.origin)
                         for k, v in group.items()}
        env.names[load.var] = group
        env.configs[load.var] = complete


def _option_value(words, option: str) -> Optional[str]:
    for k, w in enumerate(words):
        if w.text == option and k + 1 < len(words):
            nxt = words[k + 1]
            return None if nxt.unknown else nxt.text
        if w.text.startswith(option + "="):
            return None if w.unknown else w.text.split("=", 1)[1]
    return None
