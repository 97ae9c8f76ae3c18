from fsdplint import advisories
from fsdplint.advisories import predicate
from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._advisory_facts import script_facts

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
    releases is marked unverified and only warns. An unknown version (not declared, locked or installed)
    reports nothing; a version the code only proves as a lower bound reports a warning.

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
        # The version is unknown: nothing is reported on a guess.
        Valid(_FSDP1_8BIT_OPTIM),
        # accelerate 1.12 with torch 2.7: the argument exists.
        Valid(_PREPARED, target={"accelerate": "1.12.0", "torch": "2.7"}, options={"accelerate_config": YAML_FSDP2}),
        # accelerate 1.13 on torch 2.6: it passes the argument only on torch >= 2.7.
        Valid(_PREPARED, target={"accelerate": "1.13.0", "torch": "2.6"}, options={"accelerate_config": YAML_FSDP2}),
    ]
    INVALID = [
        Invalid(_FSDP1_8BIT_OPTIM, target={"bitsandbytes": "0.49.1"}, line=2),
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
        facts = script_facts(ctx.analysis)
        if not facts:
            return
        values = {k: f.value for k, f in facts.items()}
        by_site: dict = {}
        for adv in advisories.load():
            if not predicate.holds(adv.when, values):
                continue
            likely = []  # what makes the finding a warning rather than an error
            tv = ctx.version(adv.library)
            if tv.kind == "unknown" or not adv.applies_to(tv.version):
                continue
            if not tv.known:
                likely.append(f"{tv.describe()} is only a lower bound")
            others = []
            ok = True
            for lib, spec in adv.when.get("versions", {}).items():
                ov = ctx.version(lib)
                if ov.kind == "unknown" or not predicate_version(spec, ov.version):
                    ok = False
                    break
                if not ov.known:
                    likely.append(f"{ov.describe()} is only a lower bound")
                others.append(ov.describe())
            if not ok:
                continue
            if not adv.verified:
                likely.append("the advisory's affected range was not confirmed by reading both adjacent releases")
            if adv.severity == "warning":
                likely.append("the bug degrades the run rather than breaking it")
            likely += [facts[k].likely for k in adv.when if k in facts and facts[k].likely]
            fact = facts[adv.report_at]
            fixed = (f"Fixed in {adv.library} {adv.fixed}: " if adv.fixed else "No release fixes it yet: ")
            message = (
                # The advisory's summary first: concise output keeps a message's first clause.
                f"{adv.summary} (known bug {adv.id}) The job runs {tv.describe()}"
                + (f" with {', '.join(others)}" if others else "")
                + f", affected ({adv.describe_range()}); users see: {adv.error}. {fixed}{adv.fix}"
                + (f" (A warning: {'; '.join(dict.fromkeys(likely))}.)" if likely else "")
            )
            by_site.setdefault(id(fact.site), (fact.site, []))[1].append((message, bool(likely)))
        # One finding per place (the engine keeps one per code and line): several advisories set off by the
        # same setting are one finding naming each; an error when any of them is certain.
        for site, found in by_site.values():
            message = " Also ".join(m for m, _ in found)
            severity = Severity.WARNING if all(likely for _, likely in found) else None
            if hasattr(site, "filename"):
                ctx.report_setting(site, message, severity=severity)
            else:
                ctx.report(site, message, severity=severity)


def predicate_version(spec: str, version) -> bool:
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(spec).contains(version, prereleases=True)
