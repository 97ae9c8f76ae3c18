"""`fsdplint model CONFIG`: audit a model's LoRA/quantization/FSDP plan on the meta device.

Exit codes (as ruff): 0 no findings, 1 findings, 2 usage or input error.
"""

from __future__ import annotations

import sys

import click

from fsdplint.errors import FsdplintError


@click.command("model", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("config", type=click.Path(dir_okay=True))
@click.option("--lora", "lora", is_flag=False, flag_value="default", default=None, metavar="[PATH|JSON]",
              help="Apply LoRA: an adapter_config.json, inline JSON LoraConfig fields, or no value for "
                   "peft's defaults.")
@click.option("--no-lora", is_flag=True, help="Ignore the spec's LoRA section.")
@click.option("--target-modules", metavar="NAMES", help="Comma-separated LoRA target modules (or all-linear).")
@click.option("--r", "r", type=click.IntRange(min=1), help="LoRA rank.")
@click.option("--no-autocast-adapter-dtype", "no_autocast", is_flag=True,
              help="As get_peft_model(..., autocast_adapter_dtype=False): keep bf16/fp16 adapters in the model "
                   "dtype instead of peft's float32 upcast.")
@click.option("--quant", type=click.Choice(["none", "4bit", "8bit"]), help="bitsandbytes quantization.")
@click.option("--quant-storage", metavar="DTYPE", help="bnb_4bit_quant_storage (e.g. bfloat16, uint8).")
@click.option("--dtype", metavar="DTYPE", help="Model dtype (default: the config's torch_dtype).")
@click.option("--fsdp", type=click.Choice(["1", "2"]), help="FSDP version.")
@click.option("--world-size", "world_sizes", metavar="N[,N...]",
              help="Number of ranks to plan for; several (8,16,32,64) make a capacity plan.")
@click.option("--offload/--no-offload", default=None,
              help="CPU offload of parameters, gradients and optimizer state (fsdp_offload_params).")
@click.option("--plot", "plot_path", metavar="PNG", help="Draw per-rank memory by component against --gpu-memory.")
@click.option("--wrap", metavar="CLASSES", help="Comma-separated module classes that become FSDP units.")
@click.option("--use-orig-params/--no-use-orig-params", default=None, help="FSDP1 use_orig_params.")
@click.option("--gpu-memory", metavar="SIZE", help="Per-GPU memory budget, e.g. 80GiB.")
@click.option("--seq-len", type=click.IntRange(min=1), help="Tokens per sequence: estimate activations for it.")
@click.option("--micro-batch", type=click.IntRange(min=1), help="Sequences per rank per step (default 1).")
@click.option("--activation-checkpointing/--no-activation-checkpointing", default=None,
              help="Checkpoint every decoder layer (non-reentrant) in the activation estimate.")
@click.option("--adamw-fused/--no-adamw-fused", default=None,
              help="AdamW(fused=True): its step counters live on the GPU (torch's default keeps them on the CPU).")
@click.option("--torch-version", metavar="VERSION",
              help="Target torch version for version-dependent checks (default: as for scripts: "
                   "[tool.fsdplint], the project's requirements, else the installed torch).")
@click.option("--trust-remote-code", is_flag=True, help="Allow configs that need custom model code.")
@click.option("--select", metavar="CODES", help="Comma-separated codes or prefixes to report.")
@click.option("--ignore", metavar="CODES", help="Comma-separated codes or prefixes not to report.")
@click.option("--config-json", "config_json", metavar="PATH",
              help="With an axolotl / LLaMA-Factory / trl recipe YAML: the model's weights-free config.json "
                   "(or its directory).")
@click.option("--output-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
def model_command(config, select, ignore, output_format, config_json=None, world_sizes=None, plot_path=None, **flags):
    """Build CONFIG (a Hugging Face config.json, an fsdplint audit spec, JSON or TOML, or an axolotl /
    LLaMA-Factory YAML) on the meta device, apply LoRA, quantization and the FSDP plan with the real
    libraries, and audit it."""
    from fsdplint.audit.spec import load_spec

    try:
        from fsdplint.registry import select_codes, unknown_selectors

        sel = [s for s in (select or "").split(",") if s]
        ign = [s for s in (ignore or "").split(",") if s]
        bad = unknown_selectors(sel + ign)
        if bad:
            raise FsdplintError(f"unknown rule selector {bad[0]!r}")
        codes = select_codes(sel or None, ign or None) if (sel or ign) else None
        sizes = _world_sizes(world_sizes)
        if plot_path:
            from fsdplint.extras import require

            require("--plot", modules=("matplotlib",), extra="plot")
        flags["world_size"] = sizes[0] if sizes else None
        spec = _tool_spec(config, config_json, flags)
        if spec is None:
            if config_json:
                raise FsdplintError("--config-json applies to an axolotl / LLaMA-Factory YAML config")
            spec = load_spec(config, flags)
        from pathlib import Path

        from fsdplint.config import load_config

        cfg = load_config(Path(config))
        spec.config_targets = dict(cfg.target_version)
        if cfg.source is not None:
            spec.config_source = cfg.source.name
        from fsdplint.audit.runner import run_audit

        with _status(f"building {config} on the meta device and planning FSDP"):
            result = run_audit(spec, select=codes)
            plan = [result.memory]
            for n in sizes[1:]:
                import copy

                other = copy.deepcopy(spec)
                other.fsdp.world_size = n
                with _status(f"planning {n} ranks"):
                    plan.append(run_audit(other, select=codes).memory)
        if plot_path:
            from fsdplint.audit.picture import draw

            draw(plan, spec.gpu_memory, plot_path, f"{config}: FSDP{result.plan.version} per-rank memory")
    except FsdplintError as e:
        _fail(str(e), "input", config, output_format)
    except Exception as e:  # a library failure must not look like findings (exit 1) to a CI
        detail = " ".join(f"{type(e).__name__}: {e}".split())[:400]
        _fail(f"internal error while auditing {config}: {detail}", "internal", config, output_format)
    from fsdplint.audit import report

    out = sys.stdout
    if output_format == "json":
        report.write_json(result, out)
    else:
        report.write_text(result, out, color=out.isatty())
        if len(plan) > 1:
            from fsdplint.audit.picture import text_table

            out.write("\n" + "\n".join(text_table(plan, spec.gpu_memory)) + "\n")
        if plot_path:
            out.write(f"Memory plot written to {plot_path}\n")
    sys.exit(result.exit_code)


def _world_sizes(value):
    if not value:
        return []
    try:
        sizes = [int(v) for v in str(value).split(",") if v.strip()]
    except ValueError:
        raise FsdplintError(f"--world-size {value!r}: expected a number of ranks or a list like 8,16,32") from None
    if not sizes or min(sizes) < 1:
        raise FsdplintError(f"--world-size {value!r}: a world size is at least 1")
    return sizes


class _status:
    """A status line on stderr while a slow step runs, only when stderr is a terminal."""

    def __init__(self, what: str):
        self.what = what
        self.shown = sys.stderr.isatty()

    def __enter__(self):
        if self.shown:
            sys.stderr.write(f"\rfsdplint: {self.what}...")
            sys.stderr.flush()
        return self

    def __exit__(self, *exc):
        if self.shown:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
        return False


def _tool_spec(config, config_json, flags):
    """The audit spec of an axolotl / LLaMA-Factory YAML (None for other inputs)."""
    from pathlib import Path

    path = Path(config)
    if path.suffix.lower() not in (".yaml", ".yml") or not path.is_file():
        return None
    from fsdplint.audit.spec import AuditInputError, apply_overrides
    from fsdplint.launch.tools.read import read_job

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise AuditInputError(f"{path}: cannot read the config: {e}") from None
    job = read_job(text, str(path), path=path, recipes=True)
    if job is None:
        import yaml

        try:
            yaml.safe_load(text)
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            row = f":{mark.line + 1}" if mark is not None else ""
            raise AuditInputError(f"{path}{row}: invalid YAML: {(e.problem or e.context or '').strip()}") from None
        except yaml.YAMLError as e:
            raise AuditInputError(f"{path}: invalid YAML: {e}") from None
        raise AuditInputError(f"{path}:1: not an axolotl, LLaMA-Factory or trl recipe config "
                              f"(YAML audit specs are not supported)")
    if job.launch is None:
        from fsdplint.launch.tools.jobs import launch_for_job

        launch_for_job(job, path)  # FSDP from the accelerate config a launcher names with it
    from fsdplint.audit.tool_job_spec import spec_for_job

    spec = spec_for_job(job, config_json)
    apply_overrides(spec, flags)
    return spec
def _fail(message: str, kind: str, config: str, output_format: str) -> None:
    """One line on stderr, exit 2; with --output-format json also a JSON object on stdout."""
    if output_format == "json":
        import json

        json.dump({"config": str(config), "error": {"kind": kind, "message": message}, "findings": []},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    click.echo(f"fsdplint: error: {message}", err=True)
    sys.exit(2)


def main():  # pragma: no cover - `python -m fsdplint.audit.cli`
    model_command()


if __name__ == "__main__":  # pragma: no cover
    main()
