import os
import re
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from fsdplint import advisories, versions
from fsdplint.advisories import predicate
from fsdplint.findings import Position, Related, Severity
from fsdplint.launch.settings import Setting
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._advisory_facts import job_facts, optimizer_library, script_facts
from fsdplint.rules._jobs import job_of
from fsdplint.launch.tools.defaults import TOOL_PACKAGES

YAML_FSDP2 = """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
num_processes: 4
"""
_PREPARED = """
from accelerate import Accelerator
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained("m")
accelerator = Accelerator()
model = accelerator.prepare(model)
"""
_FSDP1_8BIT_OPTIM = """
from transformers import Trainer, TrainingArguments
args = TrainingArguments("out", fsdp="full_shard auto_wrap", optim="paged_adamw_8bit")
trainer = Trainer(model=model, args=args)
"""


class KnownBugAtVersion(Rule):
    code = "FSDP601"
    name = "known-bug-at-version"
    severity = Severity.ERROR
    summary = "The job runs a library release with a known FSDP/LoRA/quantization bug that its settings trigger."
    sides = "S"
    doc = """
    ## What it does
    Reports the advisories (`fsdplint advisories`) whose trigger holds for this job: a library release
    inside the advisory's affected range (from `--target-version`, `[tool.fsdplint]`, a lock file, the
    declared requirement or the installed distribution) and the job settings that set the bug off (FSDP
    version, CPU offload, 4-/8-bit loading, the optimizer, the trainer class, gradient accumulation, the
    save settings), read from the script, its `TrainingArguments`/`SFTConfig`, its command line and its
    accelerate config. The finding sits on the line that writes the triggering setting and names the
    release that fixes the bug.

    One advisory class is the optimizer state FSDP cannot carry: bitsandbytes' 8-bit and paged optimizers
    (`optim="adamw_8bit"`, `"paged_adamw_8bit"`, `bnb.optim.AdamW8bit`) keep quantization state (`qmap`,
    `absmax`) whose shapes are not the parameters' shapes, so FSDP1's optimizer-state gathering at the first
    checkpoint save fails before bitsandbytes 0.49.2; under FSDP2 their kernels receive DTensors, and with
    CPU offload the step runs on the CPU-resident shards, where bitsandbytes before 0.50.0 has no 8-bit or
    paged kernels (`All input tensors need to be on the same GPU` at the first `optimizer.step`).

    ## Why is this bad?
    The job crashes (or trains wrongly) in a way the user's code did not cause: a library release carries
    the bug, often at the first checkpoint save hours into the run. The fix is a version bump or a one-line
    workaround, named in the message.

    ## Example
    ```python
    # requirements.txt: bitsandbytes==0.49.1
    args = TrainingArguments("out", fsdp="full_shard auto_wrap", optim="paged_adamw_8bit")
    ```

    ## Use instead
    ```python
    # requirements.txt: bitsandbytes>=0.49.2
    args = TrainingArguments("out", fsdp="full_shard auto_wrap", optim="paged_adamw_8bit")
    ```

    ## Fix safety
    No automatic fix: upgrading a library is the project's decision.

    ## Versions
    Each advisory names its affected releases; an advisory whose boundary was not read at both adjacent
    releases is marked unverified and only warns. A version the code only proves as a lower bound, or a
    declared range that also admits the fixed release (`accelerate>=1.11`), reports a warning. A declared
    range whose lower bound is not affected but which admits an affected release (`accelerate>=0.27.2`
    against a bug of accelerate >= 0.30.0) reports a warning that names that release, except for a bug of
    one minor series' patch releases. A library the project does not declare takes its installed release
    (what an install of an unpinned project gives): a bug fixed there is not reported.

    An unknown version (not declared, locked or installed) reports a warning that names the affected range,
    the fixed release and what decides it (a pin, or `--target-version LIB=X`), once per advisory and file,
    and only when nothing else is uncertain: a trigger that is only likely (a setting under an undecidable
    `if`), an unconfirmed range, a degrading (not breaking) bug, or a second library of the trigger whose
    version is unknown too (accelerate and torch both undeclared) report nothing.

    Where the affected version comes from a pin (a `requirements*.txt` line, a pyproject dependency, a
    lock file entry), the pin's line is reported too, once, with the triggering setting as its related
    location. An advisory may name the library functions its bug is reached through (`reached_through`):
    on a training tool's job that replaces those functions with its own (axolotl >= 0.12.0 swaps in its own
    FSDP2 `fsdp2_prepare_model`), it is not reported, and only warns when the tool's version is unknown.
    Advisories of a training tool (axolotl, LLaMA-Factory) apply to that tool's YAML jobs: their
    facts (optimizer, gradient accumulation, quantization, adapter, RL stage, FSDP settings) are read from
    the YAML, the finding sits on the YAML line, and the tool's version is its declared or installed one, or
    the checkout's own (axolotl's VERSION file, LLaMA-Factory's extras/env.py).

    ## References
    - fsdplint/advisories/data/ (one file per advisory, with its citations)
    """
    references = ("https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1840",
                  "https://github.com/huggingface/accelerate/pull/3924")

    VALID = [
        # The fixed bitsandbytes release.
        Valid(_FSDP1_8BIT_OPTIM, target={"bitsandbytes": "0.49.2"}),
        # No optimizer state is saved: the affected gathering never runs.
        Valid(_FSDP1_8BIT_OPTIM.replace('optim="paged_adamw_8bit"', 'optim="paged_adamw_8bit", save_only_model=True'),
              target={"bitsandbytes": "0.49.1"}),
        # A custom loop that never saves optimizer state.
        Valid(
            """
            import bitsandbytes as bnb
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, use_orig_params=True)
            optimizer = bnb.optim.PagedAdamW8bit(model.parameters(), lr=1e-4)
            """,
            target={"bitsandbytes": "0.48.2"},
        ),
        # A 32-bit optimizer.
        Valid(_FSDP1_8BIT_OPTIM.replace("paged_adamw_8bit", "adamw_torch"), target={"bitsandbytes": "0.49.1"}),
        # The version is unknown and the trigger only likely (written under an `if` fsdplint cannot decide):
        # two unknowns are a guess, nothing is reported.
        Valid(
            """
            import os
            from accelerate import Accelerator
            def setup(cfg):
                os.environ["ACCELERATE_USE_FSDP"] = "true"
                os.environ["FSDP_VERSION"] = "2"
                os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "true"
                if cfg.offload_params:
                    os.environ["FSDP_OFFLOAD_PARAMS"] = "true"
                return Accelerator().prepare(model)
            """,
        ),
        # accelerate 1.12 with torch 2.7: the argument exists.
        Valid(_PREPARED, target={"accelerate": "1.12.0", "torch": "2.7"}, options={"accelerate_config": YAML_FSDP2}),
        # accelerate 1.13 on torch 2.6: it passes the argument only on torch >= 2.7.
        Valid(_PREPARED, target={"accelerate": "1.13.0", "torch": "2.6"}, options={"accelerate_config": YAML_FSDP2}),
    ]
    INVALID = [
        Invalid(_FSDP1_8BIT_OPTIM, target={"bitsandbytes": "0.49.1"}, line=2),
        # The version is unknown but the trigger certain: a warning that says what to declare.
        Invalid(_FSDP1_8BIT_OPTIM, line=2, severity="warning"),
        # A bitsandbytes optimizer class under an FSDP1 wrap.
        Invalid(
            """
            import bitsandbytes as bnb
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, use_orig_params=True)
            optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=1e-4)
            torch.save(FSDP.optim_state_dict(model, optimizer), "optim.pt")
            """,
            target={"bitsandbytes": "0.48.2"},
            line=4,
        ),
        # The accelerate config's fsdp_version line.
        Invalid(_PREPARED, target={"accelerate": "1.11.0", "torch": "2.6"}, options={"accelerate_config": YAML_FSDP2},
                line=3),
    ]

    def check(self, ctx) -> None:
        job = job_of(ctx)
        facts = script_facts(ctx.analysis)
        if job is not None:
            facts.update(job_facts(job))
        if not facts:
            return
        values = {k: f.value for k, f in facts.items()}
        by_site: dict = {}
        pins: dict = {}  # (pin file, line) -> [(message, likely, trigger)]
        for adv in advisories.load():
            if not predicate.holds(adv.when, values):
                continue
            if adv.library == "accelerate" and values.get("fsdp_wrapper") == "torch":
                continue  # a bug of accelerate's FSDP preparation; this job wraps with torch's own API
            if "optim" in adv.when and optimizer_library(values.get("optim")) not in (None, adv.library):
                continue  # another library's optimizer (torchao's adamw_torch_8bit is no bitsandbytes one)
            trigger_likely = [facts[k].likely for k in adv.when if k in facts and facts[k].likely]
            found = _versions_affected(ctx, adv, job)
            if found is None:
                continue  # a known version outside the affected range
            main, others, unknown, likely = found
            replaced = _replaced_by_tool(adv, job)
            if replaced is None:
                continue  # the tool runs its own code instead of the library's with the bug
            if replaced:
                likely.append(replaced)
            # Report where the advisory says; a trigger met by an absent fact (e.g. `peft_method` not
            # set, which a negated condition accepts) falls back to another of its triggering settings.
            fact = facts.get(adv.report_at) or next((facts[k] for k in adv.when if k in facts), None)
            if fact is None:
                continue
            fixed = (f"Fixed in {adv.library} {adv.fixed}: " if adv.fixed else "No release fixes it yet: ")
            if unknown:
                # The trigger is written but a version is not declared: worth a warning only when nothing
                # else is uncertain (a likely trigger, an unconfirmed range or a second unknown library on top
                # of an unknown version would be a guess).
                if trigger_likely or likely or not adv.verified or adv.severity == "warning" or len(unknown) > 1:
                    continue
                if _version_not_worth_asking(adv, unknown[0]):
                    continue  # every release fsdplint covers (its oldest is what an unknown version assumes) is fixed
                declare = "; ".join(
                    f"declare the {lib} version: pin it in requirements / pyproject or pass --target-version {lib}=X"
                    for lib in unknown)
                ranges = adv.describe_range() + "".join(
                    f" with {lib} {spec}" for lib, spec in adv.when.get("versions", {}).items())
                message = (f"{adv.summary} (known bug {adv.id}) The job's settings set it off, but "
                           f"{' and '.join(unknown)} {'has' if len(unknown) == 1 else 'have'} no known version "
                           f"here; affected: {ranges}; users see: {adv.error}. {fixed}{adv.fix} To decide: "
                           f"{declare}.")
                by_site.setdefault(id(fact.site), (fact.site, []))[1].append((message, True))
                continue
            if not adv.verified:
                likely.append("the advisory's affected range was not confirmed by reading both adjacent releases")
            if adv.severity == "warning":
                likely.append("the bug degrades the run rather than breaking it")
            likely += trigger_likely
            warn = f" (A warning: {'; '.join(dict.fromkeys(likely))}.)" if likely else ""
            message = (
                # The advisory's summary first: concise output keeps a message's first clause.
                f"{adv.summary} (known bug {adv.id}) The job runs {main.describe()}"
                + (f" with {', '.join(others)}" if others else "")
                + f", affected ({adv.describe_range()}); users see: {adv.error}. {fixed}{adv.fix}{warn}"
            )
            by_site.setdefault(id(fact.site), (fact.site, []))[1].append((message, bool(likely)))
            pin = versions.pin_site(adv.library, ctx.path, ctx.options.get("project_root"))
            if pin is not None and main.kind in ("lock", "declared"):
                at = (
                    f"{adv.summary} (known bug {adv.id}) This "
                    f"{'requirement admits' if _requirement(main) is not None else 'pin selects'} {main.describe()}, affected "
                    f"({adv.describe_range()}), and the job's settings set it off (the related location); "
                    f"users see: {adv.error}. {fixed}{adv.fix}{warn}")
                pins.setdefault(pin, []).append((at, bool(likely), fact.site))
        # One finding per place (the engine keeps one per code and line): several advisories set off by the
        # same setting are one finding naming each; an error when any of them is certain.
        for site, found in by_site.values():
            message = " Also ".join(m for m, _ in found)
            severity = Severity.WARNING if all(likely for _, likely in found) else None
            if hasattr(site, "filename"):
                ctx.report_setting(site, message, severity=severity)
            else:
                ctx.report(site, message, severity=severity)
        # The pin that selects the affected release, reported once (the same message from each file that
        # sets the bug off is one finding), with the triggering setting as its related location.
        for (pin_path, row), found in pins.items():
            message = " Also ".join(m for m, _, _ in found)
            severity = Severity.WARNING if all(likely for _, likely, _ in found) else None
            ctx.report_pin(Setting("requirement", None, _shown(ctx, pin_path), row), message,
                           _related(ctx, found[0][2]), severity=severity)


def _version_not_worth_asking(adv, lib: str) -> bool:
    """Whether an unknown version is not worth a warning: every affected release is older than the oldest
    release fsdplint covers (versions.DEFAULTS, what an unknown version is assumed to be), or the bug lives in
    the patch releases of one minor series only (transformers 4.47.0 alone) - asking every job that does not pin
    the library about one patch release would be noise; a job that declares an affected version still gets the
    finding."""
    spec = adv.affected if lib == adv.library else SpecifierSet(adv.when["versions"][lib])
    if _one_series(spec):
        return True
    uppers = [Version(s.version) for s in spec if s.operator in ("<", "<=")]
    oldest = versions.DEFAULTS.get(lib)
    return oldest is not None and bool(uppers) and min(uppers) <= Version(oldest)


# Library functions a training tool swaps for its own, from which release, for which FSDP version: axolotl's
# patch_accelerate_fsdp2 (monkeypatch/accelerate/fsdp2.py, applied when fsdp_version is 2) replaces
# accelerate's fsdp2_load_full_state_dict from v0.8.1, Accelerator.get_state_dict from v0.10.0 and
# fsdp2_prepare_model (with everything it calls, the auto-wrap policy included) from v0.12.0.
TOOL_REPLACES = {
    "axolotl": (
        (2, "0.8.1", "accelerate.utils.fsdp_utils.fsdp2_load_full_state_dict"),
        (2, "0.10.0", "accelerate.Accelerator.get_state_dict"),
        (2, "0.12.0", "accelerate.utils.fsdp_utils.fsdp2_prepare_model"),
    ),
}


def _replaced_by_tool(adv, job):
    """None when the job's tool replaces every function the bug is reached through (the advisory does not
    apply); a reason to warn when the tool's version does not say; "" when the tool runs the library's code."""
    if job is None or not adv.reached_through:
        return ""
    table = [(since, name) for fsdp, since, name in TOOL_REPLACES.get(job.tool, ()) if fsdp == job.fsdp_version]
    names = {name for _, name in table}
    if not table or not set(adv.reached_through) <= names:
        return ""
    tv = job.tool_version
    firsts = [Version(since) for since, name in table if name in adv.reached_through]
    if tv is not None and tv.version >= max(firsts):
        return None
    if tv is not None:
        return ""  # an older tool release: the library's own code runs
    return (f"{job.name} replaces {', '.join(adv.reached_through)} with its own from {max(firsts)}; "
            f"declare the {job.tool} version to decide")


def _shown(ctx, pin: Path) -> str:
    """The pin file named as the linted file is (relative to the working directory, or absolute)."""
    if os.path.isabs(ctx.filename):
        return str(pin)
    try:
        return os.path.relpath(pin)
    except ValueError:
        return str(pin)


def _related(ctx, site) -> Related:
    """The triggering setting as a related location: its script line, or its YAML line."""
    node = getattr(site, "node", site) if hasattr(site, "filename") else site
    if node is not None:
        from fsdplint.analysis.index import locate

        hit = locate(ctx.analysis, node)  # a setting in another module of the project (a helper's call)
        if hit is not None:
            other = hit[0]
            return Related(other.filename, other.start, other.end, "the setting that sets the bug off")
        if id(node) not in ctx.analysis.c.top:
            return Related(ctx.filename, Position(1, 1), Position(1, 1), "the setting that sets the bug off")
        start, end = ctx.positions.range(node)
        return Related(ctx.filename, start, end, "the setting that sets the bug off")
    return Related(site.filename, Position(site.line, 1), Position(site.line, 1), "the setting that sets the bug off")


_NOT_THIS_JOB = object()


def _tool_version(lib: str, job):
    """A training tool's version for its own job (declared, installed or the checkout's own), else nothing
    applies: an axolotl advisory is about axolotl jobs."""
    if job is None or job.tool != lib:
        return _NOT_THIS_JOB
    if job.tool_version is None:
        return versions.TargetVersion(lib, Version("0"), "unknown", "unknown")
    return job.tool_version


def _versions_affected(ctx, adv, job):
    """(the library's version, the other libraries' descriptions, libraries with no known version, reasons the
    versions are only likely), or None when a known version lies outside the affected range."""
    main = None
    others, unknown, likely = [], [], []
    wanted = [(adv.library, adv.affected)] + [(lib, SpecifierSet(spec)) for lib, spec in adv.when.get("versions", {}).items()]
    for lib, spec in wanted:
        tv = _tool_version(lib, job) if lib in TOOL_PACKAGES else ctx.version(lib)
        if tv is _NOT_THIS_JOB:
            return None
        if lib == adv.library:
            main = tv
        if tv.kind == "unknown":
            unknown.append(lib)
            continue
        if not spec.contains(tv.version, prereleases=True):
            # A declared range stands for every release it admits, not only its lower bound: one that admits
            # an affected release (accelerate>=0.27.2 against an affected accelerate>=0.30.0) is affected too,
            # as a warning, since it also admits releases that are not.
            req = _requirement(tv)
            hit = _admitted(req, spec) if req is not None and not _one_series(spec) else None
            if hit is None:
                return None  # (a bug of one minor series' patch releases: a range admitting it is no sign)
            likely.append(f"{tv.source} admits {lib} {hit}, affected, but its lower bound {tv.version} is not; "
                          f"pin the {lib} the job runs to decide")
            tv = versions.TargetVersion(lib, hit, tv.source, tv.kind, tv.line)
            if lib == adv.library:
                main = tv
            else:
                others.append(tv.describe())
            continue
        if not tv.known:
            likely.append(f"{tv.describe()} is only a lower bound")
        elif lib == adv.library and adv.fixed is not None:
            req = _requirement(tv)
            if req is not None and req.contains(adv.fixed, prereleases=True):
                likely.append(f"{tv.source} also admits {lib} {adv.fixed}, which fixes it; pin "
                              f"`{lib}>={adv.fixed}` to rule the affected releases out")
        if lib != adv.library:
            others.append(tv.describe())
    return main, others, unknown, likely


def _one_series(spec: SpecifierSet) -> bool:
    """Whether an affected range is one release, or patch releases of one minor series (transformers 4.47.0
    alone): asking every job whose version is not pinned to one release about it would be noise."""
    uppers = [Version(s.version) for s in spec if s.operator in ("<", "<=")]
    lowers = [Version(s.version) for s in spec if s.operator in (">", ">=", "==", "~=")]
    if any(s.operator == "==" for s in spec):
        return True
    return bool(uppers and lowers) and (max(lowers).major, max(lowers).minor) == (min(uppers).major, min(uppers).minor)


def _admitted(req: SpecifierSet, spec: SpecifierSet):
    """The lowest release both specifier sets admit (a declared range and an affected range), or None. Tried
    at the versions either set names and the next patch release after each (`>0.30` admits 0.30.1)."""
    cands = set()
    for s in list(req) + list(spec):
        v = versions.parse_version(s.version)
        if v is None:
            continue
        cands.add(v)
        rel = v.release + (0,) * (3 - len(v.release)) if len(v.release) < 3 else v.release
        cands.add(Version(".".join(map(str, rel[:-1] + (rel[-1] + 1,)))))
    for v in sorted(cands):
        if req.contains(v, prereleases=True) and spec.contains(v, prereleases=True):
            return v
    return None


def _requirement(tv):
    """The specifier of a declared requirement (`requirements.txt: accelerate>=1.11`), None for an exact
    pin or a version read elsewhere."""
    if tv.kind != "declared" or ": " not in tv.source:
        return None
    text = tv.source.split(": ", 1)[1].split(";", 1)[0].split("#", 1)[0].strip()
    m = re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*\s*(\[[^\]]*\])?\s*(.*)$", text)
    if not m or not m.group(2):
        return None
    try:
        spec = SpecifierSet(m.group(2).strip("() "))
    except InvalidSpecifier:
        return None
    if any(s.operator in ("==", "===") and "*" not in s.version for s in spec):
        return None  # one release
    return spec
