"""`fsdplint train.py --model config.json`: audit the model with the settings the script writes.

The LoraConfig, BitsAndBytesConfig, load dtype and FSDP settings that a script spells as
literals (see `fsdplint.audit.from_script`) feed a model audit on the meta device; its
findings are reported at the script's lines with the same codes. A setting the script
computes at run time is not guessed: the checks that depend on it are left out and a note
on stderr says so. torch and friends are imported only here, i.e. only with `--model`.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from fsdplint.audit.from_script import DEFAULT_WORLD_SIZE, NO_FSDP_CODES, ScriptSettings, extract

__all__ = ["audit_script", "audit_scripts", "build_spec", "extract"]


def build_spec(settings: ScriptSettings, model_config: Path, filename: str):
    """An AuditSpec for the script: the model from `model_config`, the rest from the script.

    `model_config` is a Hugging Face config.json, or an audit spec whose sections the
    script's literals override.
    """
    from fsdplint.audit.spec import AuditInputError, _read_mapping, is_hf_config, spec_from_dict

    from fsdplint.audit.hub import resolve

    path = resolve(str(model_config)).config  # a file, a model directory or a hub id (config.json only)
    data, _ = _read_mapping(path, "model config")
    if is_hf_config(data):
        raw: dict = {"model": str(path.resolve())}
        if "quantization_config" in data:
            raw["quantization"] = data["quantization_config"]
    elif "model" in data:
        raw = {k: v for k, v in data.items()}
        model = raw["model"]
        if isinstance(model, str) and not Path(model).is_absolute():
            raw["model"] = str((path.parent / model).resolve())
    else:
        raise AuditInputError(f"{path}: neither a Hugging Face config (no 'model_type'/'architectures') nor an "
                              f"fsdplint audit spec (no 'model' section)")
    if settings.lora is not None:
        raw["lora"] = settings.lora
    if settings.quantization is not None:
        raw["quantization"] = settings.quantization
    if settings.dtype is not None:
        raw["dtype"] = settings.dtype
    if settings.fsdp is not None:
        raw["fsdp"] = dict(raw.get("fsdp") or {}, **settings.fsdp)
        if settings.world_size_assumed:
            if "world_size" in raw["fsdp"]:
                settings.world_size_assumed = False  # the audit spec fixes it
            else:
                raw["fsdp"]["world_size"] = DEFAULT_WORLD_SIZE
                settings.notes.append(f"world size not fixed by the script or its launch config: audited at "
                                      f"{DEFAULT_WORLD_SIZE} ranks")
    spec = spec_from_dict(raw, filename=filename, base_dir=path.parent, locations=settings.locations)
    spec.autocast_adapter_dtype = settings.autocast_adapter_dtype
    spec.cast_after_lora = settings.cast_after_lora
    return spec


def audit_scripts(results: list, model_config: Path, settings) -> None:
    """Run the model audit for each linted script and add its findings to `results` in place."""
    import click

    from fsdplint.errors import FsdplintError

    for res in results:
        name = res.filename
        if name.endswith((".yaml", ".yml")) or any(f.code in ("FSDP900", "FSDP903") for f in res.findings):
            continue
        text = res.source.text if res.source is not None else None
        if text is None:
            try:
                text = Path(name).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
        try:
            added, notes = audit_script(text, name, model_config, settings, res.findings)
        except FsdplintError:
            raise
        except Exception as e:  # a crash in the model stack stays inside this script's report
            from fsdplint.engine import INTERNAL_ERROR, _finding

            msg = f"the model audit failed on this script: {type(e).__name__}: {e}".splitlines()[0]
            res.findings.append(_finding(INTERNAL_ERROR, name, msg))
            continue
        res.findings[:] = added
        for note in notes:
            click.echo(f"fsdplint: note: {name}: {note}", err=True)


def audit_script(text: str, filename: str, model_config: Path, settings, static: list) -> tuple[list, list]:
    """(static findings merged with the audit's, notes) for one script."""
    from dataclasses import replace

    from fsdplint.audit.runner import run_audit
    from fsdplint.context import LintContext
    from fsdplint.engine import FileConfig
    from fsdplint.noqa import NoqaMap

    path = Path(filename) if filename != "-" else None
    fcfg = FileConfig(settings, path)
    noqa = NoqaMap(text)
    if noqa.file_exempt:
        return list(static), []
    module = cst.parse_module(text)
    config_source = fcfg.config.source.name if fcfg.config.source else "[tool.fsdplint]"
    ctx = LintContext(filename=filename, path=path, source=text, module=module, explicit_targets=settings.targets,
                      config_targets=fcfg.config.target_version, config_source=config_source,
                      options=settings.options, use_installed=settings.use_installed)
    versions = {"explicit": settings.targets, "config": fcfg.config.target_version, "config_source": config_source}
    s = extract(ctx.analysis, path, versions, module, text)
    spec = build_spec(s, model_config, filename)
    spec.target_versions = dict(settings.targets)
    spec.config_targets = dict(fcfg.config.target_version)
    spec.config_source = config_source
    spec.version_path = path
    codes = set(fcfg.codes) - s.skip
    if s.fsdp is None:
        codes &= NO_FSDP_CODES
    result = run_audit(spec, select=codes)
    lines = text.splitlines()
    label = f"model audit of {Path(model_config).name}"
    if s.fsdp is not None:
        label += f", FSDP{result.plan.version} at world size {result.plan.world_size}"
        label += " (assumed)" if s.world_size_assumed else ""
    merged = list(static)
    static_codes = {g.code for g in static if g.filename == filename}
    for f in result.findings:
        same = [g for g in merged if g.code == f.code and g.start.row == f.start.row and g.filename == filename]
        if f.code in static_codes and not same:
            continue  # the static pass already explains this problem at the line that causes it
        if noqa.suppresses(f.code, (f.start.row,)):
            continue
        line = lines[f.start.row - 1] if 0 < f.start.row <= len(lines) else ""
        new = replace(f, message=f"{f.message} [{label}]", source_line=line)
        # One finding per code and line: the audit ran the real libraries, so it replaces
        # the static finding there (keeping its fix, if any).
        for g in same:
            merged.remove(g)
            if g.fix is not None and new.fix is None:
                new = replace(new, fix=g.fix)
        merged.append(new)
    merged = _drop_used_noqa_warnings(merged, noqa)
    return merged, [*s.notes, *[n for n in result.notes if n.startswith("checks target")]]


def _drop_used_noqa_warnings(findings: list, noqa) -> list:
    """A `# noqa: CODE` the audit used is not unused after all (FSDP902 from the static pass)."""
    used = {row: d.used for row, d in noqa.by_row.items() if d.used}
    out = []
    for f in findings:
        if f.code == "FSDP902" and f.start.row in used:
            import re

            listed = re.search(r"non-matching: ([^)]*)\)", f.message)
            rest = [c.strip() for c in listed.group(1).split(",")] if listed else []
            rest = [c for c in rest if c not in used[f.start.row]]
            if not rest:
                continue
            from dataclasses import replace

            f = replace(f, message=re.sub(r"non-matching: [^)]*\)", f"non-matching: {', '.join(rest)})", f.message))
        out.append(f)
    return out
