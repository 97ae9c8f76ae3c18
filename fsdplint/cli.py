"""Command line: `fsdplint [PATH]...` (lint), `fsdplint rule CODE`, `fsdplint rules`, `fsdplint model CFG`.

Exit codes as ruff: 0 nothing left to report, 1 findings left, 2 usage or internal error.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterable, Optional

import click

from fsdplint import __version__
from fsdplint.errors import FsdplintError, UsageError

FORMATS = ("concise", "full", "json", "json-lines", "github", "sarif", "junit")
SUBCOMMANDS = ("check", "rule", "rules", "model", "run", "server", "advisories", "version")


class DefaultGroup(click.Group):
    """`fsdplint train.py` means `fsdplint check train.py`."""

    def parse_args(self, ctx, args):
        if not args or (args[0] not in self.commands and args[0] not in ("--help", "-h", "--version")):
            args = ["check", *args]
        return super().parse_args(ctx, args)


def _split(values: Iterable[str]) -> list[str]:
    out = []
    for v in values or ():
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out


def _targets(target_version: Iterable[str], torch_version: Optional[str]) -> dict[str, str]:
    from fsdplint.launch.tools.defaults import TOOL_PACKAGES
    from fsdplint.versions import PACKAGES, parse_version

    known = (*PACKAGES, *TOOL_PACKAGES)  # libraries, and the training tools whose configs are linted
    out: dict[str, str] = {}
    for item in _split(target_version):
        pkg, sep, ver = item.partition("=")
        pkg = pkg.strip().lower()
        ver = ver.lstrip("=").strip()
        if not sep or pkg not in known or parse_version(ver) is None:
            raise UsageError(f"--target-version {item!r}: expected PACKAGE=VERSION with PACKAGE one of {', '.join(known)}")
        out[pkg] = ver
    if torch_version:
        if parse_version(torch_version) is None:
            raise UsageError(f"--torch-version {torch_version!r}: not a version")
        out["torch"] = torch_version
    return out


def discover(paths: Iterable[str], settings, force_exclude: bool = False) -> list[str]:
    """Python files under `paths` (explicit files count unless `force_exclude`; directories honour `exclude`)."""
    from fsdplint.config import Config, load_config

    files: list[str] = []
    for p in paths:
        if p == "-":
            files.append(p)
            continue
        path = Path(p)
        if not path.exists() and not path.is_symlink():
            raise UsageError(f"{p}: No such file or directory")
        if path.is_dir():
            from fsdplint.launch.tools.launchers import accelerate_configs_named_by, search_root

            # Accelerate configs a launcher of the project passes with --config_file are linted wherever they
            # sit (the launcher may live outside the folder named here).
            named = {os.path.normpath(str(Path(p).resolve()))
                     for p in accelerate_configs_named_by(search_root(path, str(path)))}
            # ... and those the commands of --launch pass (they replace the project's launchers).
            for launch in settings.options.get("launches") or ():
                word = launch.options.get("config_file")
                if launch.launcher == "accelerate" and word is not None and not word.unknown:
                    for base in (Path.cwd(), path):
                        cand = Path(word.text) if os.path.isabs(word.text) else base / word.text
                        if cand.is_file():
                            named.add(os.path.normpath(str(cand.resolve())))
                            break
            for root, dirs, names in os.walk(path, followlinks=False):
                rootp = Path(root)
                cfg = Config() if settings.isolated else load_config(rootp, explicit=Path(settings.config_path) if settings.config_path else None)
                dirs[:] = sorted(d for d in dirs if not cfg.is_excluded(rootp / d))
                for n in sorted(names):
                    fp = rootp / n
                    if n.endswith((".py", ".pyi", ".ipynb")) and not cfg.is_excluded(fp):
                        files.append(str(fp))
                    elif n.endswith((".yaml", ".yml")) and not cfg.is_excluded(fp) and _lintable_yaml(fp, named):
                        files.append(str(fp))
        else:
            # YAML files (pre-commit passes them too) are linted as accelerate configs; others report nothing.
            if force_exclude and not settings.isolated:
                cfg = load_config(path, explicit=Path(settings.config_path) if settings.config_path else None)
                if cfg.is_excluded(path):
                    continue
            files.append(p)
    return files


_YAML_SNIFF_BYTES = 1 << 20


def _expand_launchers(paths, settings) -> tuple:
    """A shell launcher named on the command line stands for its launches: the scripts it runs are linted
    under those launches (as `--launch` would give them), the shell text is never parsed as Python."""
    from fsdplint.launch.shell import is_launcher_file, launcher_targets

    out, given = [], []
    for p in paths:
        path = Path(p)
        if p == "-" or not path.is_file() or not is_launcher_file(path):
            out.append(p)
            continue
        try:
            launches, scripts, warnings = launcher_targets(path)
        except OSError as e:
            raise UsageError(str(e))
        for w in warnings:
            click.echo(f"fsdplint: warning: {w}", err=True)
        given.extend(launches)
        for s in scripts:
            try:
                shown = os.path.relpath(s)
            except ValueError:
                shown = str(s)
            if not shown.startswith(".." + os.sep + ".."):
                s = Path(shown)
            if str(s) not in out:
                out.append(str(s))
    if given:
        settings.options["launcher_launches"] = given
    return tuple(out)


def _lintable_yaml(path: Path, named: set) -> bool:
    """A YAML file in a linted directory is linted when it is a training-tool config (by content)
    or an accelerate config a launcher names."""
    if os.path.normpath(str(path.resolve())) in named:
        return True
    try:
        if path.stat().st_size > _YAML_SNIFF_BYTES:
            return False
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    from fsdplint.launch.tools.read import recognise

    return recognise(text, str(path)) is not None


def _config_warnings(files: list[str], settings) -> list[str]:
    """Warnings (unknown keys, ...) of every configuration file that applies, once each."""
    from fsdplint.config import load_config

    if settings.isolated:
        return []
    explicit = Path(settings.config_path) if settings.config_path else None
    seen, out = set(), []
    for f in files if files != ["-"] else ["."]:
        cfg = load_config(Path(f), explicit=explicit)
        if cfg.source is not None and cfg.source not in seen:
            seen.add(cfg.source)
            out.extend(cfg.warnings)
    return out


def _atomic_write(path: Path, data: bytes, original: bytes) -> Optional[str]:
    """Replace `path` with `data` unless it changed on disk since it was read."""
    import tempfile

    # Through a symlink: replace the file it points to, not the link itself.
    path = Path(os.path.realpath(path))
    try:
        if path.read_bytes() != original:
            return "the file changed on disk while it was being fixed; left unchanged"
        st = path.stat()
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".fsdplint", dir=str(path.parent))
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, st.st_mode & 0o7777)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError as e:
        raise OSError(f"cannot write the fixed file: {e.strerror or e}") from None
    return None


def _run_files(files: list[str], settings, jobs: int, stdin_text: Optional[str], stdin_filename: Optional[str]):
    from fsdplint.engine import lint_file, lint_files, lint_files_parallel

    if stdin_text is not None:
        from fsdplint.relocate import relocate

        return relocate([lint_file(stdin_filename or "-", settings, text=stdin_text)])
    if jobs <= 1 or len(files) < 2:
        return lint_files(files, settings)
    return lint_files_parallel(files, settings, jobs)


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="fsdplint")
def main() -> None:
    """Find PyTorch FSDP + LoRA/QLoRA bugs before the job is launched."""


@main.command("check")
@click.argument("paths", nargs=-1)
@click.option("--select", multiple=True, help="Rule codes or prefixes to enable (comma-separated), e.g. FSDP1.")
@click.option("--ignore", multiple=True, help="Rule codes or prefixes to disable.")
@click.option("--extend-select", multiple=True, help="Codes or prefixes to enable on top of the selection.")
@click.option("--fix/--no-fix", default=False, help="Apply safe fixes.")
@click.option("--unsafe-fixes", is_flag=True, help="Also apply fixes that may change behaviour.")
@click.option("--diff", is_flag=True, help="Print the fixes as a unified diff; write nothing.")
@click.option("--output-format", type=click.Choice(FORMATS), default=None, help="Report format.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when findings remain.")
@click.option("--fail-level", type=click.Choice(("error", "warning", "info")), default="warning", show_default=True,
              help="The lowest severity that fails the run (exit 1); findings below it are reported only.")
@click.option("--sarif-all-rules", is_flag=True, help="With --output-format sarif: describe every rule, not only those with results.")
@click.option("-j", "--jobs", type=int, default=0, help="Worker processes (default: the CPU count for many files).")
@click.option("--stdin-filename", default=None, help="The name to report for source read from stdin (`-`).")
@click.option("--target-version", multiple=True, help="Library versions to check against, e.g. torch=2.6.")
@click.option("--torch-version", default=None, help="Shorthand for --target-version torch=VERSION.")
@click.option("--config", "config_path", default=None, help="Use this configuration file for every linted file.")
@click.option("--isolated", is_flag=True, help="Ignore all configuration files.")
@click.option("--show-internal-errors", is_flag=True, help="Print tracebacks of internal errors.")
@click.option("-v", "--verbose", is_flag=True,
              help="Verbose: print what each file's findings rest on (project root, launches, configs, versions) "
                   "to stderr, and tracebacks of internal errors.")
@click.option("--show-settings", is_flag=True,
              help="Print what each file would be linted with (project root, launches, configs, versions) and exit.")
@click.option("--accelerate-config", default=None, help="An accelerate config YAML the scripts are launched with.")
@click.option("--launch", "launch_cmds", multiple=True,
              help='A command that launches the scripts, e.g. "accelerate launch --use_fsdp train.py --load_in_4bit" '
                   "(repeatable; replaces the launchers found in the project's shell scripts).")
@click.option("--model", "model_config", default=None, help="A model config.json to audit with the script's LoRA/quantization/FSDP settings.")
@click.option("--color/--no-color", default=None, help="Colour the report (default: on a terminal, unless NO_COLOR is set).")
@click.option("-o", "--output-file", default=None, help="Write the report to this file instead of stdout.")
@click.option("--baseline", "baseline_path", default=None, help="Report only findings not recorded in this baseline file.")
@click.option("--write-baseline", "write_baseline_path", default=None, help="Record the current findings in this baseline file.")
@click.option("--add-noqa", is_flag=True, help="Add `# noqa: CODE` comments to silence the current findings.")
@click.option("--statistics", is_flag=True, help="Print the number of findings per rule instead of each finding.")
@click.option("--show-fixes", is_flag=True, help="List the available (and applied) fixes.")
@click.option("--force-exclude", is_flag=True, help="Apply `exclude` to files named on the command line too (for pre-commit).")
@click.option("--no-cache", is_flag=True, help="Neither read nor write the cache of per-file fact sheets.")
@click.option("--cache-dir", default=None, envvar="FSDPLINT_CACHE_DIR",
              help="Where to keep the cache (default: .fsdplint_cache in the project root).")
@click.option("--no-project", is_flag=True, help="Lint each file alone: do not follow imports of the project's modules.")
def check(paths, select, ignore, extend_select, fix, unsafe_fixes, diff, output_format, exit_zero, jobs,
          stdin_filename, target_version, torch_version, config_path, isolated, show_internal_errors, verbose,
          accelerate_config, model_config, color, output_file, baseline_path, write_baseline_path, add_noqa,
          statistics, show_fixes, force_exclude, no_cache, cache_dir, no_project, launch_cmds=(),
          show_settings=False, fail_level="warning", sarif_all_rules=False) -> None:
    """Lint training scripts (files, directories, or `-` for stdin)."""
    from fsdplint.engine import Settings

    try:
        settings = Settings(
            select=_split(select) or None,
            ignore=_split(ignore),
            extend_select=_split(extend_select),
            targets=_targets(target_version, torch_version),
            config_path=config_path,
            isolated=isolated,
            fix=("unsafe" if unsafe_fixes else "safe") if (fix or diff) else None,
            show_internal_errors=show_internal_errors or verbose,
            project=not no_project,
            cache_dir=cache_dir,
            use_cache=not no_cache,
        )
        from fsdplint.registry import unknown_selectors

        bad = unknown_selectors([*(settings.select or []), *settings.ignore, *settings.extend_select])
        if bad:
            raise UsageError(f"unknown rule selector: {', '.join(bad)} (see `fsdplint rules`)")
        if add_noqa and (fix or diff or unsafe_fixes):
            raise UsageError("--add-noqa cannot be combined with --fix, --unsafe-fixes or --diff")
        baseline = None
        if baseline_path:
            from fsdplint.baseline import load_baseline

            baseline = load_baseline(Path(baseline_path))
        if model_config:
            from fsdplint.extras import require

            require("--model (the model audit)")
            settings.options["model_config"] = model_config
        if launch_cmds:
            from fsdplint.launch.shell import launches_from_command

            launches = []
            for cmd in launch_cmds:
                got = launches_from_command(cmd)
                if not got:
                    from fsdplint.launch.shell import parse_launches, unbound_notice

                    notice = unbound_notice(cmd)
                    if notice is not None:  # well-formed, just nothing of the project to lint under it
                        click.echo(f"warning: --launch {cmd!r}: {notice}", err=True)
                        continue

                    why = ("it launches a deepspeed job, not FSDP" if parse_launches(cmd, "--launch")
                           else "no Python script or module is launched there")
                    raise UsageError(f"--launch {cmd!r}: {why}")
                launches.extend(got)
            if launches:
                settings.options["launches"] = launches
        if accelerate_config:
            from fsdplint.launch.settings import load_accelerate_config

            settings.options["launch"] = load_accelerate_config(Path(accelerate_config))
        if not paths:
            paths = (".",)
        paths = _expand_launchers(paths, settings)
        dirs = [p for p in paths if p != "-" and Path(p).is_dir()]
        if dirs:
            # Launchers that name a config or script are looked for under the linted directory.
            settings.options.setdefault("project_root", str(Path(dirs[0]).resolve()))
        stdin_text = None
        if list(paths) == ["-"]:
            stdin_text = sys.stdin.read()
            files = ["-"]
        else:
            files = discover(paths, settings, force_exclude=force_exclude)
        for w in _config_warnings(files, settings):
            click.echo(f"fsdplint: warning: {w}", err=True)
        if show_settings or verbose:
            from fsdplint.explain import explain_file

            for f in files:
                for line in explain_file(f, settings):
                    click.echo(line, err=not show_settings)
            if show_settings:
                return
        if jobs <= 0:
            jobs = min(os.cpu_count() or 1, 8) if len(files) >= 16 else 1
        results = _run_files(files, settings, jobs, stdin_text, stdin_filename)
        if model_config:
            from fsdplint.script_audit import audit_scripts

            audit_scripts(results, Path(model_config), settings)
    except FsdplintError as e:
        click.echo(f"fsdplint: error: {e}", err=True)
        sys.exit(2)

    from fsdplint.output import RunSummary, write_report

    findings = []
    seen_findings = set()
    fixed = 0
    # Fixes refused to keep a file intact: the findings stay, so they count like findings (exit 1).
    write_errors = []
    io_errors = []
    diff_changes = False
    for res in results:
        for f in res.findings:
            # A launch config next to several scripts is reported once.
            key = (f.filename, f.start, f.code, f.message)
            if key not in seen_findings:
                seen_findings.add(key)
                findings.append(f)
        if res.fix_error:
            write_errors.append(f"{res.filename}: {res.fix_error}")
        if res.fixed_text is None:
            if stdin_text is not None and settings.fix and not diff:
                sys.stdout.write(stdin_text)  # nothing to fix: an editor piping through us keeps its text
            continue
        if diff:
            import difflib

            diff_changes = True
            sys.stdout.write(
                "".join(
                    difflib.unified_diff(
                        res.original.splitlines(keepends=True),
                        res.fixed_text.splitlines(keepends=True),
                        fromfile=f"a/{res.filename.lstrip('/')}",
                        tofile=f"b/{res.filename.lstrip('/')}",
                    )
                )
            )
            continue
        if res.filename == "-" or stdin_text is not None:
            sys.stdout.write(res.fixed_text)
            fixed += res.fixed
            continue
        p = Path(res.filename)
        original = res.source.encode(res.original)
        try:
            err = _atomic_write(p, res.source.encode(res.fixed_text), original)
        except OSError as e:  # the tool cannot do its job: exit 2
            io_errors.append(f"{res.filename}: {e}")
            continue
        if err:
            write_errors.append(f"{res.filename}: {err}")
        else:
            fixed += res.fixed

    try:
        if write_baseline_path:
            from fsdplint.baseline import write_baseline

            n = write_baseline(findings, Path(write_baseline_path))
            click.echo(f"Recorded {n} finding{'' if n == 1 else 's'} in {write_baseline_path}", err=True)
            sys.exit(2 if io_errors else 1 if write_errors else 0)
        if add_noqa:
            from fsdplint.add_noqa import add_noqa as insert_noqa

            # Errors about the file itself and stale noqa comments are not silenced by more comments.
            n = insert_noqa(f for f in findings if f.code not in ("FSDP900", "FSDP901", "FSDP902", "FSDP903"))
            click.echo(f"Added {n} noqa directive{'' if n == 1 else 's'}.", err=True)
            sys.exit(0)
        if baseline is not None:
            findings, _suppressed = baseline.filter(findings)
    except FsdplintError as e:
        click.echo(f"fsdplint: error: {e}", err=True)
        sys.exit(2)

    report_file = None
    if output_file:
        try:
            report_file = open(output_file, "w", encoding="utf-8", newline="")
        except OSError as e:
            click.echo(f"fsdplint: error: {output_file}: cannot write the report: {e.strerror or e}", err=True)
            sys.exit(2)
        if color is None:
            color = False
    if color is None:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    summary = RunSummary(
        files_checked=len(results),
        fixed=fixed,
        fixable_safe=sum(1 for f in findings if f.fix and f.fix.applicability.value == "safe"),
        fixable_unsafe=sum(1 for f in findings if f.fix and f.fix.applicability.value == "unsafe"),
    )
    out = sys.stderr if (stdin_text is not None and settings.fix and not diff) else sys.stdout
    if report_file is not None:
        out = report_file
    if not diff:
        write_report(findings, output_format or "concise", out, color=color, summary=summary,
                     show_fixes=show_fixes, statistics=statistics, all_rules=sarif_all_rules)
    if report_file is not None:
        report_file.close()
    for w in [*write_errors, *io_errors]:
        click.echo(f"fsdplint: error: {w}", err=True)
    if io_errors:
        sys.exit(2)
    if write_errors and not exit_zero:
        sys.exit(1)
    if exit_zero:
        sys.exit(0)
    if diff:
        sys.exit(1 if diff_changes else 0)
    sys.exit(1 if failing(findings, fail_level) else 0)


def failing(findings, fail_level: str) -> list:
    """The findings at or above `--fail-level`: advice (info) reported but not failing a commit by default."""
    from fsdplint.findings import Severity

    limit = Severity(fail_level).rank
    return [f for f in findings if f.severity.rank <= limit]


@main.command("rule")
@click.argument("code")
def rule_cmd(code: str) -> None:
    """Print a rule's documentation."""
    from fsdplint.registry import get_rule

    rule = get_rule(code)
    if rule is None:
        click.echo(f"fsdplint: error: unknown rule {code!r} (see `fsdplint rules`)", err=True)
        sys.exit(2)
    click.echo(rule.full_doc())


@main.command("rules")
@click.option("--output-format", type=click.Choice(("text", "json")), default="text")
def rules_cmd(output_format: str) -> None:
    """List every rule: code, name, severity, side(s), fix."""
    from fsdplint.registry import all_rules
    from fsdplint.rule import SIDE_NAMES

    rows = []
    for r in all_rules():
        rows.append(
            {
                "code": r.code,
                "name": r.name,
                "severity": r.severity.value,
                "sides": [SIDE_NAMES[s] for s in r.sides],
                "fix": r.fix.value if r.fix else None,
                "summary": r.summary,
            }
        )
    if output_format == "json":
        import json

        click.echo(json.dumps(rows, indent=2))
        return
    w = max(len(r["name"]) for r in rows)
    click.echo(f"{'code':<8} {'name':<{w}} {'severity':<8} {'side':<22} {'fix':<7}")
    for r in rows:
        click.echo(f"{r['code']:<8} {r['name']:<{w}} {r['severity']:<8} {','.join(r['sides']):<22} {r['fix'] or '-':<7}")


@main.command("server")
def server_cmd() -> None:
    """Run the language server over stdio (diagnostics, fixes as code actions, rule docs on hover)."""
    from fsdplint.extras import require

    try:
        require("`fsdplint server`", modules=("pygls", "lsprotocol"), extra="server")
    except FsdplintError as e:
        click.echo(f"fsdplint: error: {e}", err=True)
        sys.exit(2)
    from fsdplint.language_server import serve

    serve()


@main.command("advisories")
@click.argument("path", required=False)
@click.option("--target-version", multiple=True, help="Library versions the job runs, e.g. accelerate=1.12.")
@click.option("--output-format", type=click.Choice(("text", "json")), default="text")
def advisories_cmd(path: Optional[str], target_version, output_format: str) -> None:
    """List the known library bugs (FSDP601): all of them, or those the given versions (--target-version, or
    the lock file / requirements of the project at PATH) carry."""
    from pathlib import Path

    from fsdplint import advisories, versions

    targets = _targets(target_version, None)
    rows = []
    for adv in advisories.load():
        version = targets.get(adv.library)
        why = "--target-version" if version else None
        at = Path(path) / "_" if path is not None and Path(path).is_dir() else (Path(path) if path else None)
        if version is None and at is not None and adv.library in versions.DEFAULTS:
            tv = versions.resolve(adv.library, at, use_installed=False)
            if tv.known:
                version, why = str(tv.version), tv.source
        elif version is None and at is not None:
            # A training tool: its declared version, or the checkout's own (axolotl's VERSION file).
            from fsdplint.launch.tools.defaults import tool_version

            tv = tool_version(adv.library, at, use_installed=False)
            if tv is not None:
                version, why = str(tv.version), tv.source
        if version is not None and not adv.applies_to(versions.Version(version)):
            continue
        row = adv.as_dict()
        row["target"] = {"version": version, "source": why} if version else None
        rows.append(row)
    if output_format == "json":
        import json

        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        fixed = f"fixed in {r['fixed']}" if r["fixed"] else "not fixed yet"
        note = "" if r["verified"] else " [unverified]"
        at = f"; the job runs {r['library']} {r['target']['version']} ({r['target']['source']})" if r["target"] else ""
        click.echo(f"{r['id']}: {r['library']} {r['affected']}, {fixed}{note}{at}\n    {r['summary']}")


def _model_command():
    try:
        from fsdplint.audit.cli import model_command
    except ImportError:
        return None
    return model_command


class _LazyModel(click.Command):
    """`fsdplint model` imports torch/peft only when it is run."""

    def __init__(self):
        super().__init__("model", help="Audit a model config on the meta device (needs fsdplint[model]).", add_help_option=False,
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True})

    def invoke(self, ctx):
        from fsdplint.extras import require

        if not {"-h", "--help"} & set(ctx.args):
            try:
                require("`fsdplint model`")
            except FsdplintError as e:
                click.echo(f"fsdplint: error: {e}", err=True)
                sys.exit(2)
        cmd = _model_command()
        if cmd is None:
            click.echo("fsdplint: error: `fsdplint model` needs the model extra: pip install 'fsdplint[model]'", err=True)
            sys.exit(2)
        return cmd.main(args=ctx.args, prog_name="fsdplint model", standalone_mode=True)

    def parse_args(self, ctx, args):
        ctx.args = list(args)
        return []


main.add_command(_LazyModel())


class _LazyRun(click.Command):
    """`fsdplint run` (fsdplint/run/) executes the job's code: imported only when it is asked for,
    never from `check` or pre-commit."""

    def __init__(self):
        super().__init__("run", help="Run the job's real launch on a CPU in a fake world of N GPUs, no weights "
                                     "(EXECUTES the job's code; needs fsdplint[run]).", add_help_option=False,
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True})

    def invoke(self, ctx):
        from fsdplint.run.cli import run_command

        return run_command.main(args=ctx.args, prog_name="fsdplint run", standalone_mode=True)

    def parse_args(self, ctx, args):
        ctx.args = list(args)
        return []


main.add_command(_LazyRun())


if __name__ == "__main__":  # pragma: no cover
    main()
