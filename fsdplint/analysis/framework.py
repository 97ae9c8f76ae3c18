"""The FSDP wrap a framework does for the script: `accelerator.prepare(model)`, the HF Trainer and trl's trainers.

Most LoRA jobs never write `FullyShardedDataParallel(...)`: accelerate's `prepare`, or the Trainer inside
`train()`, wraps the model with the FSDP plan of the job — an accelerate config (or its `FSDP_*`
environment), `TrainingArguments(fsdp=..., fsdp_config=...)`, the `--fsdp` flags of the launch. A
`FrameworkWrap` is one such wrap point with that plan read the way the framework reads it: the FSDP
version, the auto-wrap policy, `use_orig_params` (the framework's own default at the version in force
when the plan leaves it out), mixed precision. Rules judge the units there as they judge an explicit wrap;
a deciding value nobody can read (a version not declared, a setting behind a variable) is named in
`undecided`, so the finding is a warning that says what to declare, never an error on a guess.

Where each default was read: accelerate's plugin (`FSDP_USE_ORIG_PARAMS` default "False",
`FSDP_AUTO_WRAP_POLICY` default "NO_WRAP": accelerate v0.25.0, v0.30.0, v1.0.0 and v1.14.0
utils/dataclasses.py), the Trainer's (behaviour.py `trainer_fsdp_use_orig_params_default`,
`trainer_peft_wrap_policy`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from fsdplint.unknown import UNKNOWN

# Event kinds at which a framework wraps the model.
FRAMEWORK_WRAP_KINDS = ("prepare", "trainer_wrap")
# accelerate's named FSDP1 policies other than peft's: none of them gives a LoRA leaf a unit of its own.
NAMED_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")


@dataclass
class FrameworkWrap:
    timeline: Any = field(repr=False)
    event: Any = field(repr=False)  # the `prepare` / `trainer_wrap` event
    by: str  # "accelerate" (accelerator.prepare) or "trainer" (Trainer / trl trainer)
    plan_by: str  # whose settings and defaults apply: "accelerate" (its plugin) or "trainer" (`fsdp=` options)
    version: Optional[int]
    # "peft" (LoRA leaves get units of their own), "mixing" (whole blocks, or the root, hold base and LoRA
    # weights together), "unknown".
    policy: str
    policy_text: str
    policy_setting: Any = None
    orig: Optional[bool] = None  # use_orig_params; None: not known
    orig_text: str = ""
    orig_setting: Any = None
    # Why use_orig_params is not known, when something could be declared to decide it ("": not decidable here).
    orig_open: str = ""
    # What would decide a value left open, e.g. "the transformers version (the Trainer's ... from 4.39)".
    undecided: list = field(default_factory=list)
    rests_on: tuple = ()  # behaviour.py keys the answer used
    mixed_precision: Any = None

    @property
    def node(self):
        return self.event.node

    @property
    def entity(self):
        return self.event.entity

    @property
    def setting(self):
        """Where the plan says what makes the units what they are: use_orig_params, else the policy."""
        return self.orig_setting or self.policy_setting

    @property
    def wrapper(self) -> str:
        if self.by == "trainer":
            return "the Trainer (when train() runs)"
        if self.by == "composer":
            return "Composer's Trainer (given fsdp_config=)"
        return "accelerator.prepare"


def _truthy(v) -> Optional[bool]:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.strip().lower() in ("true", "1", "yes")
    return None


def covered_holds(key: str, tv, ctx=None) -> Optional[bool]:
    """behaviour.holds for a framework default, where a version nobody declared is any release the job may run:
    the releases a known version of a library that requires this one admits (trl 0.11 needs transformers
    >= 4.40), else every release. A behaviour that started at or before that floor and never stopped holds on
    all of them; otherwise the answer differs between releases the job may run, and stays undecided (None),
    so the finding is a warning that names the release to declare. (The oldest release fsdplint covers is not
    such a floor: a project that declares nothing may run an older one, as FastChat's LoRA jobs of 2023 ran
    transformers 4.28.)"""
    from packaging.version import Version

    from fsdplint import behaviour
    from fsdplint.versions import admitted_floor

    answer = behaviour.holds(key, tv)
    if answer is None and getattr(tv, "kind", "") == "unknown":
        b = behaviour.BEHAVIOURS[key]
        floor = admitted_floor(tv.package, ctx.version if ctx is not None else None)
        if floor is not None and b.until is None and b.since is not None and Version(b.since) <= floor[0]:
            return True
    return answer


def _version_open(tv, since: str, what: str, ctx=None) -> str:
    """The undecided note for a framework default that changes at `since` while `tv` is not known."""
    from fsdplint.versions import admitted_floor

    floor = admitted_floor(tv.package, ctx.version if ctx is not None else None) if tv.kind == "unknown" else None
    if tv.kind == "code":
        known = f"{tv.describe()} only"
    elif floor is not None:
        known = f"{tv.package} undeclared, and {floor[1]} admits {tv.package} >= {floor[0]}"
    else:
        known = f"{tv.package} undeclared ({tv.source.removeprefix('unknown: ').split(';')[0]})"
    return (f"the {tv.package} version ({what} from {tv.package} {since}, not before; {known}: declare "
            f"{tv.package}>={since} to decide)")


def _where(setting) -> str:
    import os

    if setting is None:
        return ""
    name = getattr(setting, "filename", "")
    if name:
        rel = os.path.relpath(name) if os.path.isabs(name) else name
        return f"{rel if not rel.startswith('..') else name}:{setting.line}"
    return "the script"


def framework_wraps(a, ctx) -> list[FrameworkWrap]:
    """Every framework wrap of the file's programs under the job's FSDP plan (`a.launch`), in order."""
    launch = getattr(a, "launch", None)
    on = launch is not None and launch.fsdp_version in (1, 2)
    out = []
    for t in a.timelines:
        for kind in FRAMEWORK_WRAP_KINDS:
            for ev in t.of(kind):
                if ev.entity is None:
                    continue
                if ev.data.get("api") == "composer_Trainer":
                    fw = _composer_plan(a, ctx, t, ev)
                    if fw is not None:
                        out.append(fw)
                elif on and not _xla(launch):
                    out.append(_plan(a, ctx, launch, t, ev))
    out.sort(key=lambda w: (id(w.timeline), w.event.seq))
    return out


def _xla(launch) -> bool:
    """`fsdp_config={"xla": True}`: the Trainer wraps with torch_xla's FSDP (or its SPMD FSDPv2 with
    `xla_fsdp_v2`), whose units, flattening and defaults are not torch FSDP1's (transformers trainer.py
    `if self.is_fsdp_xla_enabled:` ... `XlaFullyShardedDataParallel`); its plan is not judged as FSDP1's."""
    s = launch.get("xla")
    return s is not None and s.value is not UNKNOWN and _truthy(s.value) is True


def _plan(a, ctx, launch, t, ev) -> FrameworkWrap:
    from fsdplint import behaviour

    by = "trainer" if ev.kind == "trainer_wrap" else "accelerate"
    sharding = launch.get("sharding")
    plan_by = "trainer" if (by == "trainer" and sharding is not None) else "accelerate"
    fw = FrameworkWrap(t, ev, by, plan_by, launch.fsdp_version, "unknown", "", mixed_precision=launch.get(
        "mixed_precision"))
    tfv = ctx.version("transformers")
    rests = []

    # -- use_orig_params ------------------------------------------------------------------------------
    s = launch.get("use_orig_params")
    if s is not None:
        fw.orig_setting = s
        fw.orig = None if s.value is UNKNOWN else _truthy(s.value)
        fw.orig_text = f"use_orig_params={s.value} ({_where(s)})"
        if fw.orig is None:
            fw.orig_open = f"the value of use_orig_params ({_where(s)})"
            fw.undecided.append(fw.orig_open)
    elif plan_by == "trainer":
        fw.orig_setting = sharding
        answer = covered_holds("trainer_fsdp_use_orig_params_default", tfv, ctx)
        b = behaviour.BEHAVIOURS["trainer_fsdp_use_orig_params_default"]
        rests.append(b.key)
        fw.orig = answer
        if answer is None:
            fw.orig_text = (f"use_orig_params left to the Trainer, which passes True from transformers {b.since} "
                            f"and False before")
            fw.orig_open = _version_open(tfv, b.since, "the Trainer defaults use_orig_params to True", ctx)
            fw.undecided.append(fw.orig_open)
        else:
            fw.orig_text = (f"use_orig_params={answer}, the Trainer's default on {tfv.describe()} (True from "
                            f"transformers {b.since})")
    else:
        from fsdplint.launch.tools.defaults import use_orig_params_default

        fw.orig = use_orig_params_default("accelerate")
        fw.orig_text = f"use_orig_params={fw.orig} (accelerate's default: the plan leaves it out)"

    # -- the auto-wrap policy ---------------------------------------------------------------------------
    if a.calls("peft_fsdp_auto_wrap_policy"):
        fw.policy, fw.policy_text = "peft", "peft's fsdp_auto_wrap_policy, set on the plugin by the script"
        fw.rests_on = tuple(rests)
        return fw
    if by == "trainer":
        b = behaviour.BEHAVIOURS["trainer_peft_wrap_policy"]
        swaps = covered_holds(b.key, tfv, ctx)
        rests.append(b.key)
        if swaps:
            fw.policy, fw.policy_text = "peft", (f"peft's fsdp_auto_wrap_policy, which the Trainer sets for a PEFT "
                                                 f"model on {tfv.describe()}")
            fw.rests_on = tuple(rests)
            return fw
        if swaps is None:
            fw.undecided.append(_version_open(tfv, b.since, "the Trainer replaces the policy with peft's "
                                              "fsdp_auto_wrap_policy for a PEFT model", ctx))
    if plan_by == "trainer":
        fw.policy_setting = sharding
        value = sharding.value
        if value is UNKNOWN or value is None:
            fw.policy, fw.policy_text = "unknown", "the Trainer's fsdp options (not readable)"
        else:
            options = value if isinstance(value, (list, tuple)) else str(value).split()
            options = [str(o).strip().lower() for o in options]
            fw.policy = "mixing"
            if "auto_wrap" in options:
                fw.policy_text = (f"the Trainer's auto_wrap policy (fsdp=\"{' '.join(options)}\", {_where(sharding)}), "
                                  f"which wraps whole decoder layers")
            else:
                fw.policy_text = (f"no auto-wrap policy (fsdp=\"{' '.join(options)}\", {_where(sharding)}): the "
                                  f"root unit holds every parameter")
    else:
        p = launch.get("auto_wrap_policy")
        fw.policy_setting = p
        value = "NO_WRAP" if p is None else p.value
        if value is UNKNOWN or value is None:
            fw.policy, fw.policy_text = "unknown", f"auto_wrap_policy ({_where(p)}, not readable)"
        elif str(value).strip().upper() in NAMED_POLICIES:
            fw.policy = "mixing"
            name = str(value).strip().upper()
            src = f"{_where(p)}" if p is not None else "accelerate's default when the config names none"
            fw.policy_text = (f"{name} ({src}), " + ("so the root unit holds every parameter" if name == "NO_WRAP"
                                                     else "which wraps whole layers"))
        else:
            fw.policy, fw.policy_text = "unknown", f"auto_wrap_policy {value} ({_where(p)})"
    fw.rests_on = tuple(rests)
    return fw


# Composer passes use_orig_params=True unless fsdp_config says otherwise: composer v0.14.0 and v0.14.1
# trainer/dist_strategy.py (`fsdp_config.get('use_orig_params', True)`, on torch >= 2.0), v0.15.0 to v0.22.0
# (`fsdp_config.setdefault('use_orig_params', True)`), v0.23.0 to v0.32.1 utils/parallelism.py
# (`FSDPConfig.use_orig_params: bool = True`); v0.13.5 passed none (torch's False), on the torch 1.13 it supported.
COMPOSER_ORIG_PARAMS_DEFAULT = True


def _composer_plan(a, ctx, t, ev) -> Optional[FrameworkWrap]:
    """Composer's `Trainer(model=..., fsdp_config=...)`: FSDP1 with the settings of that dict, Composer's
    defaults for the rest. Its units are the modules the model's `fsdp_wrap_fn` / `_fsdp_wrap` pick (the root
    alone when none): blocks at most, so a LoRA leaf shares its unit unless the file chooses the units itself."""
    call = ev.call
    expr = a.keyword(call, "fsdp_config")
    if expr is None:
        return None
    fw = FrameworkWrap(t, ev, "composer", "composer", 1, "mixing",
                       "the units Composer wraps (the model's fsdp_wrap_fn blocks, else the root)")
    source = getattr(ctx, "source", "") or ""
    if "fsdp_wrap_fn" in source or "_fsdp_wrap" in source:
        fw.policy, fw.policy_text = "unknown", "the units this file's fsdp_wrap_fn / _fsdp_wrap choose"
    entries = None
    if expr is UNKNOWN:
        fw.undecided.append("whether fsdp_config is given (behind **kwargs)")
    else:
        if a.value(expr, call.scope) is None:
            return None  # fsdp_config=None: no FSDP
        if a.may_be_none(expr, call.scope):
            fw.undecided.append(f"whether fsdp_config= (line {ctx.line(call.node)}) holds a config on this run "
                                f"(it may be None: no FSDP)")
        entries = a.dict_entries(expr, call.scope, call.seq)
    uop = entries.get("use_orig_params") if entries is not None else None
    if entries is None:
        fw.orig, fw.orig_text = None, "use_orig_params from an fsdp_config this file does not spell out"
    elif uop is None:
        fw.orig = COMPOSER_ORIG_PARAMS_DEFAULT
        fw.orig_text = "use_orig_params=True (Composer's default when fsdp_config leaves it out)"
    else:
        v = UNKNOWN if uop is UNKNOWN else a.value(uop, call.scope)
        fw.orig = None if v is UNKNOWN else _truthy(v)
        fw.orig_text = f"use_orig_params={a.code(uop) if uop is not UNKNOWN else '?'} (fsdp_config)"
        if fw.orig is None:
            fw.orig_open = "the value of fsdp_config's use_orig_params"
            fw.undecided.append(fw.orig_open)
    return fw


def trainable_lora_before(a, fw: FrameworkWrap) -> list:
    """The LoRA injections into the wrapped model before the wrap that leave the adapters trainable (not
    `PeftModel.from_pretrained` without `is_trainable=True`)."""
    out = []
    t = fw.timeline
    # (trl's `peft_config=`: the trainer's construction injects the adapters, an event of the same step)
    same = [e for e in t.of("lora", fw.entity) if e.step is fw.event.step]
    for e in t.before(fw.event, ("lora",)) + same:
        call = e.call
        if call is not None and call.api == "PeftModel_from_pretrained" and e.data.get("behaviour") is None:
            if a.value(call.kw("is_trainable"), call.scope) is not True:
                continue
        out.append(e)
    return out


def declare_hint(fw: FrameworkWrap, undecided: Optional[list] = None) -> str:
    """The sentence that says what would decide a finding resting on undecided values."""
    undecided = fw.undecided if undecided is None else undecided
    if not undecided:
        return ""
    return " Not decided here: " + "; and ".join(undecided) + " (declare it, or set it where the job is configured, to decide)."
