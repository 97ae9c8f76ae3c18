"""Static part of FSDP113: LoRA `target_modules` names that no module of the architecture has."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

from fsdplint.analysis import UNKNOWN
from fsdplint.rules._module_names import ALL_NAMES, FAMILIES

# Well-known hub ids → family; only unambiguous patterns (a wrong family would be a false positive).
_MODEL_IDS = (
    (r"mistralai/mixtral-", "mixtral"),
    (r"mistralai/mistral-7b", "mistral"),
    (r"meta-llama/(meta-)?llama-(2|3)", "llama"),
    (r"qwen/qwen3-[\d.]+b(-base|-instruct)?$", "qwen3"),
    (r"qwen/qwen2(\.5)?-[\d.]+b(-instruct)?$", "qwen2"),
    (r"google/gemma-2-", "gemma2"),
    (r"google/gemma-\d+b", "gemma"),
    (r"(openai-community/)?gpt2(-medium|-large|-xl)?$", "gpt2"),
    (r"eleutherai/pythia-", "gpt_neox"),
    (r"openai/gpt-oss-", "gpt_oss"),
    (r"microsoft/phi-2$", "phi"),
    (r"microsoft/phi-3", "phi3"),
    (r"(google/)?(flan-)?t5-", "t5"),
    (r"(google-bert/)?bert-(base|large)-", "bert"),
)
_MODEL_TYPES = {"qwen3_moe": "qwen3_moe", "qwen2_moe": "qwen2_moe", "gemma3": "gemma3_text", "llama4": "llama4_text",
                "phi4": "phi3", "mpt": "mpt", "roberta": "roberta"}
_REGEX_CHARS = re.compile(r"[\\^$*+?()\[\]{}|]")


def family_of(model_id: Any, model_class: Any = None, config_dir: Optional[Path] = None) -> tuple[Optional[str], str]:
    """Architecture family from a local config.json, a model class name (LlamaForCausalLM) or a
    well-known hub id; (None, "") when unsure (then LoRA target names are not checked)."""
    if isinstance(model_id, str) and config_dir is not None:
        local = Path(model_id)
        if not local.is_absolute():
            local = config_dir / local
        cfg = local / "config.json"
        if cfg.is_file():
            try:
                mt = str(json.loads(cfg.read_text(encoding="utf-8")).get("model_type", "")).lower()
            except (OSError, ValueError, AttributeError):
                mt = ""
            fam = _MODEL_TYPES.get(mt, mt)
            if fam in FAMILIES:
                return fam, str(cfg)
    if isinstance(model_class, str):
        m = re.fullmatch(r"([A-Za-z0-9]+)For[A-Za-z]+", model_class.strip())
        if m and m.group(1).lower() != "auto":
            stem = m.group(1).lower()
            by_flat = {f.replace("_", ""): f for f in FAMILIES}
            fam = by_flat.get(stem)
            if fam is not None:
                return fam, model_class.strip()
    if isinstance(model_id, str):
        for pat, fam in _MODEL_IDS:
            if re.search(pat, model_id.lower()):
                return fam, model_id
    return None, ""


def _family_from_config(ctx) -> tuple[Optional[str], str]:
    cfg: Any = ctx.options.get("model_config") if hasattr(ctx, "options") else None
    where = "the --model config"
    if isinstance(cfg, (str, Path)):
        where = str(cfg)
        try:
            cfg = json.loads(Path(cfg).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None, where
    if not isinstance(cfg, dict):
        return None, where
    mt = str(cfg.get("model_type", "")).lower()
    fam = _MODEL_TYPES.get(mt, mt)
    return (fam if fam in FAMILIES else None), where


def _family_from_loads(a) -> tuple[Optional[str], Any]:
    fams = set()
    node = None
    for call in a.calls("load_model"):
        arg = call.arg(0, "pretrained_model_name_or_path")
        v = a.value(arg, call.scope) if arg is not None else UNKNOWN
        if not isinstance(v, str):
            continue
        for pat, fam in _MODEL_IDS:
            if re.search(pat, v.lower()):
                fams.add(fam)
                node = v
                break
        else:
            return None, None  # another model is loaded too
    return (fams.pop(), node) if len(fams) == 1 else (None, None)


def _targets(a, call) -> Optional[list[str]]:
    expr = a.keyword(call, "target_modules")
    if expr is None or expr is UNKNOWN:
        return None
    v = a.value(expr, call.scope)
    if not isinstance(v, (list, tuple, set)) or not v or not all(isinstance(x, str) for x in v):
        return None
    return list(v)


def check_job(rule, ctx, job) -> None:
    """An axolotl / LLaMA-Factory job: its LoRA target names against its architecture (known family only)."""
    from fsdplint.rules._jobs import report_job

    targets = job.lora_targets
    family, family_source = family_of(*job.model_ref)
    if not targets or family is None or job.adapter is None:
        return
    names = FAMILIES[family]
    missing = []
    for t in targets:
        leaf = t.rsplit(".", 1)[-1] if not t.rsplit(".", 1)[-1].isdigit() else t.split(".")[0]
        if _REGEX_CHARS.search(t) or leaf in names:
            continue
        import difflib

        missing.append((t, difflib.get_close_matches(leaf, sorted(names), n=2, cutoff=0.8)))
    if not missing:
        return
    bad = ", ".join(repr(t) for t, _ in missing)
    hints = sorted({c for _, cl in missing for c in cl})
    effect = ("peft raises ValueError: Target modules ... not found in the base model"
              if len(missing) == len(targets) else "peft silently skips it and trains fewer adapters than configured")
    msg = f"LoRA target {bad} matches no module of {family} ({family_source}): {effect}"
    if hints:
        msg += f". Did you mean {', '.join(hints)}?"
    report_job(ctx, job.targets_setting, msg, None)


def check(rule, ctx) -> None:
    job = ctx.options.get("job") if getattr(ctx, "options", None) else None
    if job is not None:
        check_job(rule, ctx, job)
        return
    a = ctx.analysis
    configs = a.calls("LoraConfig")
    if not configs:
        return
    family, where = _family_from_config(ctx)
    if family is None:
        family, model_id = _family_from_loads(a)
        where = f'from_pretrained("{model_id}")' if family else ""
    loads = {id(c) for c in a.calls("load_model")}
    # Per program (entry function with its helpers inlined): a test's config says nothing of another test's model.
    programs = [t.item_ids for t in a.timelines if t.item_ids & loads] if loads else []
    for call in configs:
        targets = _targets(a, call)
        if not targets:
            continue
        transformers_model = any(id(call) in ids for ids in programs)
        names = FAMILIES[family] if family else ALL_NAMES
        missing = []
        for t in targets:
            leaf = t.rsplit(".", 1)[-1] if not t.rsplit(".", 1)[-1].isdigit() else t.split(".")[0]
            if _REGEX_CHARS.search(t) or leaf in names:
                continue
            import difflib  # only for a target that is not a known name

            close = difflib.get_close_matches(leaf, sorted(names), n=2, cutoff=0.8)
            if family is None and not (close and transformers_model):
                continue  # unknown architecture: only a near-miss of a real name is reported
            missing.append((t, close))
        if not missing:
            continue
        node = call.kwarg("target_modules") or call.node
        bad = ", ".join(repr(t) for t, _ in missing)
        hints = sorted({c for _, cl in missing for c in cl})
        arch = f"{family} ({where})" if family else "any known architecture"
        effect = ("peft raises ValueError: Target modules ... not found in the base model"
                  if len(missing) == len(targets) else "peft silently skips it and trains fewer adapters than configured")
        msg = f"LoRA target {bad} matches no module of {arch}: {effect}."
        if hints:
            msg += f" Did you mean {', '.join(hints)}?"
        ctx.report(node, msg)
