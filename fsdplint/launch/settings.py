"""The FSDP settings a script is launched with, wherever they are written.

Most jobs never call `FullyShardedDataParallel` themselves: they run under
`accelerate launch --config_file fsdp.yaml`, or pass `fsdp=`/`fsdp_config=` to
`TrainingArguments` (and trl's configs), or build a `FullyShardedDataParallelPlugin`.
`LaunchFacts` merges those sources under one set of keys (the `fsdp_` prefix
dropped, as transformers does) and remembers where each value was written, so a
finding can point at the YAML line that caused it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from fsdplint.unknown import UNKNOWN
from fsdplint.errors import UsageError

# Top-level accelerate keys worth keeping (besides fsdp_config).
_TOP_KEYS = ("distributed_type", "mixed_precision", "num_processes", "num_machines", "use_cpu")
# TrainingArguments / SFTConfig keyword arguments that matter to the rules.
_TRAINING_KWARGS = (
    "gradient_checkpointing", "gradient_checkpointing_kwargs", "ddp_find_unused_parameters",
    "bf16", "fp16", "torch_compile",
    # Read by the advisories (known bugs of one release that these settings trigger).
    "optim", "gradient_accumulation_steps", "save_strategy", "save_only_model", "use_vllm",
    "precompute_ref_log_probs",
)


@dataclass
class Setting:
    key: str
    value: Any
    filename: str
    line: int
    node: Any = None  # the script's cst node when the value is written in the script
    via: str = ""  # "accelerate" (accelerate config or `accelerate launch` flags), "trainer" (TrainingArguments)


@dataclass
class LaunchFacts:
    settings: dict[str, Setting] = field(default_factory=dict)
    fsdp_version: Optional[int] = None
    # Where the FSDP launch was declared (the YAML file or the script).
    source: Optional[str] = None
    text: str = ""  # YAML text, for source lines and noqa
    # Other files settings point into (a launcher's shell script, a recipe, an fsdp_config JSON): name -> text.
    texts: dict[str, str] = field(default_factory=dict)

    def get(self, key: str) -> Optional[Setting]:
        return self.settings.get(_norm(key))

    def value(self, key: str, default: Any = None) -> Any:
        s = self.get(key)
        return s.value if s is not None else default

    @property
    def uses_fsdp(self) -> bool:
        return self.fsdp_version is not None

    def merged(self, other: "LaunchFacts") -> "LaunchFacts":
        """`other` (the script) fills in what this (the YAML) leaves open."""
        out = LaunchFacts(dict(other.settings), other.fsdp_version, other.source, other.text,
                          {**other.texts, **self.texts})
        out.settings.update(self.settings)
        if self.fsdp_version is not None:
            out.fsdp_version, out.source, out.text = self.fsdp_version, self.source, self.text
        if self.source and self.text:
            out.texts.setdefault(self.source, self.text)
        return out

    def text_of(self, filename: str) -> str:
        """The text of a file a setting points into."""
        if filename == self.source and self.text:
            return self.text
        return self.texts.get(filename, "")


def _norm(key: str) -> str:
    key = key.strip().lower()
    return key[5:] if key.startswith("fsdp_") else key


def _version_of(raw: Any) -> Optional[int]:
    try:
        return int(str(raw).strip())
    except (TypeError, ValueError):
        return None


# -- accelerate YAML ------------------------------------------------------------------
def parse_accelerate_config(text: str, filename: str) -> Optional[LaunchFacts]:
    """LaunchFacts from accelerate config YAML text; None when it is not an accelerate config."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = (e.problem or e.context or "invalid YAML").strip()
        raise UsageError(f"{filename}{where}: invalid YAML: {problem}") from None
    except yaml.YAMLError as e:
        raise UsageError(f"{filename}: invalid YAML: {e}") from None
    if root is None or not isinstance(root, yaml.MappingNode):
        return None
    loader_value = _scalar_loader()
    facts = LaunchFacts(source=filename, text=text)
    fsdp_section = None
    for knode, vnode in root.value:
        key = str(knode.value)
        if key == "fsdp_config" and isinstance(vnode, yaml.MappingNode):
            fsdp_section = vnode
        elif key in _TOP_KEYS:
            facts.settings[key] = Setting(key, loader_value(vnode), filename, knode.start_mark.line + 1, via="accelerate")
    if "distributed_type" not in facts.settings and fsdp_section is None:
        return None
    if fsdp_section is not None:
        for knode, vnode in fsdp_section.value:
            key = _norm(str(knode.value))
            facts.settings[key] = Setting(key, loader_value(vnode), filename, knode.start_mark.line + 1, via="accelerate")
    dist = str(facts.value("distributed_type", "")).upper()
    if dist == "FSDP" or (fsdp_section is not None and not dist):
        raw = facts.get("version")
        version = _version_of(raw.value) if raw is not None else 1
        if version not in (1, 2):
            raise UsageError(f"{filename}:{raw.line}: fsdp_version: expected 1 or 2, got {raw.value!r}")
        facts.fsdp_version = version
    return facts


def _scalar_loader():
    import yaml

    loader = yaml.SafeLoader("")

    def value(node):
        try:
            return loader.construct_object(node, deep=True)
        except yaml.YAMLError:
            return getattr(node, "value", None)

    return value


def load_accelerate_config(path: Path) -> LaunchFacts:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{path}: cannot read the accelerate config: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: the accelerate config is not UTF-8 text") from None
    facts = parse_accelerate_config(text, str(path))
    if facts is None:
        raise UsageError(f"{path}:1: not an accelerate config (no `distributed_type` or `fsdp_config`)")
    return facts


def find_accelerate_config(script: Path) -> Optional[LaunchFacts]:
    """The single FSDP accelerate config next to a script, if there is exactly one."""
    found = []
    try:
        candidates = sorted(p for p in script.parent.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    except OSError:
        return None
    for p in candidates[:20]:
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if "distributed_type" not in text and "fsdp_config" not in text:
            continue
        try:
            facts = parse_accelerate_config(text, str(p))
        except UsageError:
            continue  # reported when the YAML itself is linted
        if facts is not None and facts.uses_fsdp:
            found.append(facts)
    return found[0] if len(found) == 1 else None


# -- settings written in the script ------------------------------------------------------
def _finished(facts: LaunchFacts, found: bool) -> Optional[LaunchFacts]:
    """None when nothing was found; else the facts, with an explicit `version` setting deciding FSDP1/2."""
    if not found:
        return None
    v = facts.get("version")
    if v is not None and facts.fsdp_version is not None:
        facts.fsdp_version = _version_of(v.value) or facts.fsdp_version
    return facts


def from_environ(analysis) -> Optional[LaunchFacts]:
    """FSDP settings the script writes into its own environment before accelerate reads them
    (`os.environ["FSDP_VERSION"] = "2"`, `os.environ["ACCELERATE_USE_FSDP"] = "true"`): they replace what the
    launcher put there, so they win over the launch config."""
    facts = LaunchFacts()
    found = False
    for scope in analysis.c.scopes:
        for ds in scope.dict_sets:
            if ds.target not in ("os.environ", "environ") or not isinstance(ds.key, str):
                continue
            key = ds.key.upper()
            value = analysis.value(ds.value, ds.scope)
            if key == "ACCELERATE_USE_FSDP":
                found = True
                if str(value).strip().lower() in ("1", "true", "yes"):
                    facts.fsdp_version = facts.fsdp_version or 1
            elif key.startswith("FSDP_"):
                found = True
                name = _norm(key)
                facts.settings[name] = Setting(name, value, "", 0, ds.value)
    return _finished(facts, found)


def with_environ(facts: LaunchFacts, env: LaunchFacts) -> LaunchFacts:
    """`facts` with the FSDP_* settings the script writes into its environment on top."""
    facts.settings.update(env.settings)
    return _finished(facts, True)


# mmengine registry names that wrap the model in torch's FSDP1 (mmengine 0.10: model/wrappers/
# fully_sharded_distributed.py `class MMFullyShardedDataParallel(FullyShardedDataParallel)`;
# _strategy/fsdp.py `FSDPStrategy`, whose model_wrapper defaults to MMFullyShardedDataParallel).
MMENGINE_FSDP1_TYPES = frozenset({"MMFullyShardedDataParallel", "FSDPStrategy"})


def _mmengine_fsdp(analysis) -> list:
    """`dict(type="FSDPStrategy", ...)` / `dict(type="MMFullyShardedDataParallel", ...)` in a config file."""
    import libcst as cst

    out = []
    for call in analysis.c.calls:
        if call.func != "dict":
            continue
        t = call.kw("type")
        name = None
        if isinstance(t, cst.SimpleString):
            name = t.evaluated_value
        elif isinstance(t, (cst.Name, cst.Attribute)):
            q = analysis.resolver.qualify(t) or ""
            name = q.rsplit(".", 1)[-1] if q.startswith("mmengine.") else None
        if isinstance(name, str) and name in MMENGINE_FSDP1_TYPES:
            out.append(call)
    return out


def from_script(analysis) -> Optional[LaunchFacts]:
    """FSDP settings from TrainingArguments/SFTConfig/... and FullyShardedDataParallelPlugin calls, and
    the FSDP wrapper or strategy of an mmengine config."""
    facts = LaunchFacts()
    found = False
    for call in _mmengine_fsdp(analysis):
        found = True
        facts.fsdp_version = 1
    for call in analysis.calls("TrainingArguments"):
        found = True

        def kw(name: str, call=call):
            # Written as `name=`, or a key of a `**kwargs` dict the script builds (`args["fsdp"] = ...`).
            arg = analysis.keyword(call, name)
            return None if arg is None or arg is UNKNOWN else arg

        for key in _TRAINING_KWARGS:
            arg = kw(key)
            if arg is not None:
                facts.settings[key] = Setting(key, analysis.value(arg, call.scope), "", 0, arg)
        fsdp = kw("fsdp")
        if fsdp is not None:
            v = analysis.value(fsdp, call.scope)
            if v not in (None, "", False, []):
                facts.fsdp_version = 1
                facts.settings["sharding"] = Setting("sharding", v, "", 0, fsdp)
        cfg = kw("fsdp_config")
        if cfg is not None:
            named = analysis.value(cfg, call.scope)
            if isinstance(named, str) and named.endswith((".json", ".yaml", ".yml")):
                # `fsdp_config="fsdp.json"`: the Trainer reads the file (relative to where the job runs).
                here = getattr(analysis, "path", None)
                _add_config_file(facts, named, tuple(str(d) for d in ((here.parent,) if here else ()))
                                 + (os.getcwd(),))
            else:
                _add_dict(facts, analysis, cfg, call.scope, call.seq)
    for call in analysis.calls("FullyShardedDataParallelPlugin"):
        found = True
        facts.fsdp_version = facts.fsdp_version or 1
        for a in call.node.args:
            if a.keyword is not None:
                key = _norm(a.keyword.value)
                facts.settings[key] = Setting(key, analysis.value(a.value, call.scope), "", 0, a.value)
    return _finished(facts, found)


def _add_dict(facts: LaunchFacts, analysis, expr, scope, before=None) -> None:
    import libcst as cst

    from fsdplint.unknown import UNKNOWN

    entries = analysis.dict_entries(expr, scope, before)
    if entries is not None:
        # (written later by `cfg["fsdp_version"] = 2` / `cfg.update(...)`: the value where it is used)
        for k, v in entries.items():
            key = _norm(k)
            facts.settings[key] = Setting(key, UNKNOWN if v is UNKNOWN else analysis.value(v, scope), "", 0,
                                          None if v is UNKNOWN else v)
        return
    bound = expr
    for _ in range(3):
        if isinstance(bound, cst.Name):
            nxt = analysis.binding(bound.value, scope)
            if nxt is None:
                break
            bound = nxt
    if isinstance(bound, cst.Dict):
        for el in bound.elements:
            if isinstance(el, cst.DictElement):
                k = analysis.value(el.key, scope)
                if isinstance(k, str):
                    key = _norm(k)
                    facts.settings[key] = Setting(key, analysis.value(el.value, scope), "", 0, el.value)
    elif isinstance(bound, cst.Call):
        for a in bound.args:
            if a.keyword is not None:
                key = _norm(a.keyword.value)
                facts.settings[key] = Setting(key, analysis.value(a.value, scope), "", 0, a.value)


# -- settings written on a launcher's command line ---------------------------------------
def _flag_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def default_accelerate_config_path() -> Path:
    """Where `accelerate launch` without --config_file reads its config, as accelerate 1.15 computes it
    (commands/config/config_args.py: `$HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else
    `~/.cache/huggingface`, then `accelerate/default_config.yaml`; launch.py uses it when the file exists
    and `--cpu` is not given). accelerate reads no environment variable naming the file itself."""
    home = os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    return Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"


def default_accelerate_config() -> Optional[LaunchFacts]:
    """The user's default accelerate config, when it enables FSDP (a default without FSDP changes nothing
    a project's own config would not say, so the project's next-to-script config is still looked up)."""
    path = default_accelerate_config_path()
    try:
        # Opened rather than tested with is_file(): the open is what the findings cache notes as a read, so a
        # default config created later invalidates findings cached while it was absent.
        with open(path, "rb"):
            pass
        facts = load_accelerate_config(path)
    except (OSError, UsageError):
        return None
    return facts if facts.uses_fsdp else None


def from_launcher(launch, base_dirs: tuple = ()) -> Optional[LaunchFacts]:
    """`accelerate launch` flags over the config file they name (the command line wins, as in
    accelerate's launch command); None when the launch says nothing about FSDP."""
    if launch.launcher != "accelerate":
        return None
    from fsdplint.launch.arguments import resolve_file

    facts: Optional[LaunchFacts] = None
    cfg = launch.options.get("config_file")
    if cfg is not None and not cfg.unknown:
        path = resolve_file(cfg.text, base_dirs)
        if path is not None:
            try:
                facts = load_accelerate_config(path)
            except UsageError:
                facts = None
    elif cfg is None and "cpu" not in launch.options:
        facts = default_accelerate_config()
    flags = {k: w for k, w in launch.options.items() if k.startswith("fsdp_") or k in _TOP_KEYS or k == "use_fsdp"}
    if not flags and facts is None:
        return None
    out = facts or LaunchFacts()
    out.texts[launch.file] = launch.text
    for name, w in flags.items():
        if name == "use_fsdp":
            continue
        key = _norm(name)
        out.settings[key] = Setting(key, _flag_value(w.text) if not w.unknown else None, launch.file, w.line,
                                    via="accelerate")
    if "use_fsdp" in launch.options or (out.fsdp_version is not None and "fsdp_version" in flags):
        out.fsdp_version = _version_of(out.value("version", 1)) or 1
        if out.source is None:
            out.source = launch.file
    elif any(k in launch.options for k in ("use_deepspeed", "multi_gpu", "cpu", "tpu", "use_megatron_lm")):
        out.fsdp_version = None
    return out if (out.fsdp_version is not None or out.settings) else None


def from_launch_env(launch) -> Optional[LaunchFacts]:
    """FSDP switched on through the environment a launcher gives the script (`ACCELERATE_USE_FSDP=1
    FSDP_VERSION=2 torchrun train.py`, `export FSDP_...`): the Accelerator reads it when it builds its FSDP
    plugin (accelerate 1.15 utils/dataclasses.py, `FullyShardedDataParallelPlugin.__post_init__` reads
    `FSDP_*`). None unless ACCELERATE_USE_FSDP is on. `accelerate launch` with FSDP in its own config writes
    these variables itself (utils/launch.py, prepare_multi_gpu_env), so there they count only when the
    launch config leaves FSDP off."""
    env = getattr(launch, "env", None) or {}
    use = env.get("ACCELERATE_USE_FSDP")
    if use is None or use.unknown or use.text.strip().lower() not in ("1", "true", "yes", "y", "on"):
        return None
    facts = LaunchFacts(source=launch.file)
    facts.texts[launch.file] = launch.text
    for name, w in env.items():
        if name == "ACCELERATE_USE_FSDP":
            continue
        key = _norm(name)
        facts.settings[key] = Setting(key, _flag_value(w.text) if not w.unknown else None, launch.file, w.line,
                                      via="accelerate")
    v = facts.get("version")
    facts.fsdp_version = (_version_of(v.value) if v is not None else None) or 1
    if facts.fsdp_version not in (1, 2):
        facts.fsdp_version = 1
    return facts


def from_arguments(env, base_dirs: tuple = ()) -> Optional[LaunchFacts]:
    """TrainingArguments fields given on the command line or in a recipe (`--fsdp "full_shard auto_wrap"
    --fsdp_config fsdp.json`, `--gradient_checkpointing`), as the Trainer would receive them."""
    from fsdplint.unknown import UNKNOWN

    if not env.training:
        return None
    facts = LaunchFacts()
    facts.texts.update(env.texts)
    for name, v in env.training:
        value = v.single
        origin = v.origin
        if name == "fsdp":
            if value not in (None, "", False, [], "no") and value is not UNKNOWN:
                facts.fsdp_version = facts.fsdp_version or 1
                facts.settings["sharding"] = Setting("sharding", value, origin.file, origin.line, via="trainer")
        elif name == "fsdp_config":
            facts.settings["fsdp_config"] = Setting("fsdp_config", value, origin.file, origin.line, via="trainer")
            if isinstance(value, str):
                _add_config_file(facts, value, base_dirs)
            elif isinstance(value, dict):
                for k, val in value.items():
                    key = _norm(str(k))
                    facts.settings[key] = Setting(key, val, origin.file, origin.line, via="trainer")
        elif name in _TRAINING_KWARGS:
            facts.settings[name] = Setting(name, value if value is not UNKNOWN else None, origin.file, origin.line,
                                           via="trainer")
    v = facts.get("version")
    if v is not None and facts.fsdp_version is not None:
        facts.fsdp_version = _version_of(v.value) or facts.fsdp_version
    return facts if facts.settings else None


def _add_config_file(facts: LaunchFacts, name: str, base_dirs: tuple) -> None:
    """The keys of the `--fsdp_config` JSON/YAML file, each at its line."""
    import os

    from fsdplint.launch.arguments import read_mapping, resolve_file

    path = resolve_file(name, base_dirs)
    if path is None:
        return
    items = read_mapping(path)
    if not items:
        return
    display = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else str(path)
    try:
        facts.texts[display] = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return
    for k, (val, line) in items.items():
        key = _norm(k)
        facts.settings[key] = Setting(key, val, display, line, via="trainer")
