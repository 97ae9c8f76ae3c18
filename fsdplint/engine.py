"""Lint one file: read, pre-filter, parse once, run every selected rule in one pass, apply noqa.

A failure stays inside its file (and a rule's crash inside that rule): it
becomes a finding with its own code, and the rest of the run goes on.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Optional

import libcst as cst

from fsdplint.apis import TRIGGER_WORDS
from fsdplint.context import LintContext
from fsdplint import findings_cache
from fsdplint.findings import Applicability, Finding, Position, Related, Severity
from fsdplint.fixes import apply_edits, to_fix
from fsdplint.noqa import NoqaMap
from fsdplint.parsing import parse_module
from fsdplint.registry import all_rules, rules_by_code
from fsdplint.relocate import CAUSE, OWN_MESSAGE, relocate
from fsdplint.launch.runs import branch_notes
from fsdplint.source import SourceError, SourceFile, decode
from fsdplint.notebook import Notebook, is_notebook, read_notebook

findings_cache.install()  # before any configuration is read (several reads are memoised per process)

SYNTAX_ERROR = "FSDP900"
INTERNAL_ERROR = "FSDP901"
UNUSED_NOQA = "FSDP902"
UNREADABLE = "FSDP903"
MAX_FIX_PASSES = 10


@dataclass
class Settings:
    """Everything a worker needs to lint a file (picklable, for -j)."""

    select: Optional[list[str]] = None
    ignore: list[str] = field(default_factory=list)
    extend_select: list[str] = field(default_factory=list)
    targets: dict[str, str] = field(default_factory=dict)
    config_path: Optional[str] = None
    isolated: bool = False
    fix: Optional[str] = None  # None, "safe" or "unsafe"
    show_internal_errors: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    use_installed: bool = True
    prefilter: bool = True
    # The project view (analysis/index.py): imports of the project's own modules are followed.
    project: bool = True
    cache_dir: Optional[str] = None  # default: <project root>/.fsdplint_cache
    use_cache: bool = True


@dataclass
class FileResult:
    filename: str
    findings: list[Finding]
    fixed: int = 0
    original: Optional[str] = None  # set when fixes changed the text
    fixed_text: Optional[str] = None
    source: Optional[SourceFile] = None
    fix_error: Optional[str] = None


def _finding(code: str, filename: str, message: str, row: int = 1, col: int = 1, line: str = "") -> Finding:
    rule = rules_by_code().get(code)
    return Finding(
        code=code,
        name=rule.name if rule else code.lower(),
        severity=rule.severity if rule else Severity.ERROR,
        filename=filename,
        start=Position(row, col),
        end=Position(row, col),
        message=message,
        source_line=line,
    )


class FileConfig:
    """Per-file selection and options from `[tool.fsdplint]` + CLI flags."""

    def __init__(self, settings: Settings, path: Optional[Path]) -> None:
        from fsdplint.config import Config, load_config

        cfg = Config()
        if not settings.isolated and (path is not None or settings.config_path):
            explicit = Path(settings.config_path) if settings.config_path else None
            cfg = load_config(path if path is not None else Path.cwd(), explicit=explicit, isolated=settings.isolated)
        self.config = cfg
        codes = cfg.selected_codes(settings.select, settings.ignore, settings.extend_select)
        if path is not None:
            codes = {c for c in codes if not cfg.is_code_ignored_for(c, path)}
        self.codes = codes

    def fixable(self, code: str) -> bool:
        return self.config.is_fixable(code)


_NOT_BRACKETS = re.compile(r"[^()\[\]{}]+")
_PAIRS = re.compile(r"\(\)|\[\]|\{\}")
# CPython refuses more than 200 nested brackets and 100 indentation levels.
_MAX_NESTING = 200
_DEEP_INDENT = re.compile(r"^[ \t]{100,}\S", re.M)


def _deeply_nested(text: str) -> bool:
    """Brackets nested past CPython's limit, or lines indented past 100 columns.

    Each pass deletes the innermost bracket pairs, so the number of passes is the
    nesting depth; brackets inside strings only make the scan stop early."""
    if _DEEP_INDENT.search(text):
        return True
    brackets = _NOT_BRACKETS.sub("", text)
    for _ in range(_MAX_NESTING):
        inner = _PAIRS.sub("", brackets)
        if inner == brackets:
            return False
        brackets = inner
    return bool(brackets)


def _cpython_verdict(text: str, filename: str) -> Optional[Finding]:
    """FSDP900 with CPython's message and position when CPython rejects the file (its messages
    read better than libcst's), else None. Newer-grammar f-strings are left to libcst."""
    try:
        ast.parse(text, filename=filename)
    except SyntaxError as se:
        if _newer_fstring(se):
            return None
        row = se.lineno or 1
        lines = text.splitlines()
        line = lines[row - 1] if 0 < row <= len(lines) else ""
        return _finding(SYNTAX_ERROR, filename, f"SyntaxError: {se.msg}", row, se.offset or 1, line)
    except ValueError as ve:  # null bytes
        return _finding(SYNTAX_ERROR, filename, f"SyntaxError: {ve}")
    except (RecursionError, MemoryError):
        return _finding(SYNTAX_ERROR, filename, "too deeply nested to parse")
    return None


def lint_text(
    text: str,
    filename: str,
    settings: Settings,
    path: Optional[Path] = None,
    fcfg: Optional[FileConfig] = None,
    module: Optional[cst.Module] = None,
) -> list[Finding]:
    """Findings for `text` (after noqa), each with its fix, if any. `module`: the parse of `text`, when the
    caller has it (the re-lints under each launch and argument set take the first lint's parse)."""
    fcfg = fcfg or FileConfig(settings, path)
    codes = fcfg.codes
    noqa = NoqaMap(text)
    if noqa.file_exempt:
        return []
    launch = settings.options.get("launch")
    report = SYNTAX_ERROR in codes
    project = _project(settings, path)
    if settings.prefilter and launch is None and not any(w in text for w in TRIGGER_WORDS) and not (
            project is not None and _imports_touching(project, path, text)):
        # Nothing any rule looks for: only make sure the file parses.
        bad = _cpython_verdict(text, filename)
        return [bad] if bad is not None and report else []
    # libcst's native parser can overflow the stack on nesting far deeper than CPython accepts:
    # such files (rare, and found by a C-speed scan) go through CPython's parser first.
    if _deeply_nested(text):
        bad = _cpython_verdict(text, filename)
        if bad is not None:
            return [bad] if report else []
    parsed = project.parsed(path, text) if project is not None else None
    try:
        if module is None:
            module = parsed.module if parsed is not None else parse_module(text, path)
        elif parsed is not None and parsed.module is not module:
            parsed = None  # its collector belongs to another tree of the same text
    except cst.ParserSyntaxError as e:
        if not report:
            return []
        msg = e.message.splitlines()[0] if e.message else "invalid syntax"
        return [_cpython_verdict(text, filename)
                or _finding(SYNTAX_ERROR, filename, f"SyntaxError: {msg}", e.raw_line, e.raw_column + 1)]
    except RecursionError:
        return [_finding(SYNTAX_ERROR, filename, "too deeply nested to parse")] if report else []
    except Exception as e:  # the parser rejects some inputs (e.g. null bytes) with other errors
        if not report:
            return []
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        return [_cpython_verdict(text, filename) or _finding(SYNTAX_ERROR, filename, f"cannot parse: {detail}")]

    if "run" not in settings.options:
        from fsdplint.launch.runs import Run, add_switched, merge, runs_for, told_apart

        def under(run, probe=None):
            opts = {**settings.options, "run": run, "switch_probe": probe}
            return lint_text(text, filename, replace(settings, options=opts), path, fcfg, module)

        runs = runs_for(path, filename, settings.options)
        if runs:  # one lint per launch (and one under the script's defaults, to tell what a launch changes)
            probes: list[set] = [set() for _ in runs]
            out = merge(runs, under(Run()), [under(r, p) for r, p in zip(runs, probes)])
            free = [Run(r.launch, frozenset(p)) for r, p in zip(runs, probes) if p]
        elif "add_argument" in text or "Parser" in text or "Fire(" in text:
            from fsdplint.launch.runs import candidate_runs, merge_candidates

            finder = project.find_module if project is not None and path is not None else None
            candidates = candidate_runs(path, text, settings.options, settings.use_installed, finder)
            probe: set = set()
            out = under(Run(), probe)
            free = [Run(None, frozenset(probe))] if probe else []
            if candidates:  # lone recipes that fit the parser: each a candidate launch, its findings warnings
                out = merge_candidates(candidates, out, [under(r) for r in candidates])
        else:
            free, out = [], None
        if out is not None:
            # Branches shut only by opt-in flags left at their default: once more with those flags free.
            return add_switched(out, [(r, told_apart(r, under(r), under)) for r in free]) if free else out
    ctx = LintContext(
        filename=filename,
        path=path,
        source=text,
        module=module,
        explicit_targets=settings.targets,
        config_targets=fcfg.config.target_version,
        config_source=str(fcfg.config.source.name) if fcfg.config.source else "[tool.fsdplint]",
        options=settings.options,
        rule_options=fcfg.config.rules,
        use_installed=settings.use_installed,
        strict_versions=fcfg.config.strict_versions,
        project=project,
        collector=parsed.collector if parsed is not None else None,
    )
    errors: list[Finding] = []
    for rule in all_rules():
        if rule.code not in codes or not rule.has_static_check():
            continue
        if rule.needs_fsdp and not ctx.fsdp_in_job:
            continue  # no FSDP anywhere in the job: not fsdplint's to judge
        ctx.rule = rule
        ctx._mentioned.clear()
        try:
            rule().check(ctx)
        except RecursionError:
            errors.append(_finding(INTERNAL_ERROR, filename, f"{rule.code} ({rule.name}) gave up: the file is too deeply nested"))
        except Exception as e:
            detail = f": {type(e).__name__}: {e}".splitlines()[0]
            msg = f"rule {rule.code} ({rule.name}) failed on this file{detail}"
            if settings.show_internal_errors:
                msg += "\n" + _traceback()
            if INTERNAL_ERROR in codes:
                errors.append(_finding(INTERNAL_ERROR, filename, msg))
    ctx.rule = None

    findings: list[Finding] = _external_findings(ctx, filename)
    rows: dict[int, tuple] = {}  # a finding's index -> the lines of this file it also depends on
    ctx.reports = [r for r in ctx.reports if r.setting is None]
    if ctx.reports:
        pos = ctx.positions
        seen = set()
        notes = branch_notes(ctx) if settings.options.get("run") is not None or "add_argument" in text or "Parser" in text \
            or "Fire(" in text else None
        from fsdplint.analysis.index import locate

        a = ctx.analysis
        for r in ctx.reports:
            node, message = r.node, r.message
            related = [x[0] for x in (locate(a, n) for n in r.related) if x is not None]
            foreign = locate(a, node)
            if foreign is not None:
                # The node sits in another module: report at the call in this file that runs it.
                site = foreign[1]
                if site is None:
                    continue
                node, related = site.node, [foreign[0], *related]
                cause = (foreign[0], message)  # reported at the cause instead when that file is linted too (relocate.py)
                message = f"{message} (in {foreign[0].filename}:{foreign[0].start.row})"
            else:
                cause = None
            start, end = pos.range(node)
            key = (r.rule.code, start)  # one finding per code and place, even if several causes
            if key in seen:
                continue
            seen.add(key)
            dead, note = notes(start.row) if notes is not None else (False, "")
            if dead:
                continue  # in a branch the known argument values rule out
            if noqa.suppresses(r.rule.code, (start.row, end.row)):
                continue
            if r.related:
                rows[len(findings)] = tuple(pos.range(n)[0].row for n in r.related if locate(a, n) is None
                                            and id(n) in a.c.top)
            fix = None
            if r.fix is not None and fcfg.fixable(r.rule.code) and foreign is None:
                fix = to_fix(r.fix, pos, module.default_newline)
            findings.append(
                Finding(
                    code=r.rule.code,
                    name=r.rule.name,
                    severity=r.severity or r.rule.severity,
                    filename=filename,
                    start=start,
                    end=end,
                    message=message + note,
                    fix=fix,
                    source_line=pos.line_text(start.row),
                    related=related,
                    notes={CAUSE: cause[0], OWN_MESSAGE: cause[1] + note} if cause else {},
                )
            )
    run = settings.options.get("run")
    a = ctx.__dict__.get("analysis")
    probe = settings.options.get("switch_probe")
    if probe is not None and a is not None:
        probe.update(a.__dict__.get("switched_off", ()))
    if run is not None and run.free and a is not None:
        from fsdplint.launch.runs import needed_switches

        for i, f in enumerate(findings):
            flags = needed_switches(ctx, f, run.free, rows.get(i, ()))
            if flags is not None:
                f.notes["switches"] = flags
    findings = _one_per_cause(findings)
    findings.extend(errors)
    if UNUSED_NOQA in codes:
        lines = text.splitlines()
        for d, unused in noqa.unused():
            if any(c in rules_by_code() for c in unused):
                line = lines[d.row - 1] if d.row - 1 < len(lines) else ""
                col = d.start - (text.rfind("\n", 0, d.start) + 1) + 1
                findings.append(
                    _finding(UNUSED_NOQA, filename, f"unused `noqa` directive (non-matching: {', '.join(unused)})", d.row, col, line)
                )
    return findings


def _one_per_cause(findings: list[Finding]) -> list[Finding]:
    """Warnings of one rule with the very same message in one file are one cause (an undeclared torch pin
    under four `fully_shard(ignored_params=...)` calls): one finding at the first place, the others as its
    related locations. Errors stay apart: each is a place that fails and is fixed on its own."""
    from fsdplint.findings import Related

    first: dict[tuple, Finding] = {}
    out = []
    for f in findings:
        if f.severity is not Severity.WARNING or f.notes.get("switches") is not None or f.fix is not None:
            out.append(f)
            continue
        k = (f.code, f.filename, f.message)
        head = first.get(k)
        if head is None:
            first[k] = f
            out.append(f)
            continue
        head.related.append(Related(f.filename, f.start, f.end, "the same cause here" + (
            f": {f.source_line.strip()}" if f.source_line.strip() else "")))
        head.related.extend(r for r in f.related if r not in head.related)
    return out


def _project(settings: Settings, path: Optional[Path]):
    if not settings.project or path is None:
        return None
    from fsdplint.analysis.index import project_for

    try:
        return project_for(path, settings.cache_dir, settings.use_cache, settings.options.get("project_root"))
    except OSError:
        return None


def _imports_touching(project, path: Path, text: str) -> bool:
    """A file that names no model operation, but imports a project function that does (`train.py` calling
    `build_model()` from `model_utils.py`): linted with the project view."""
    from fsdplint.analysis.index import quick_imports

    if "import" not in text:
        return False
    try:
        return project.imports_touching(path.resolve(), quick_imports(text))
    except (OSError, RecursionError):
        return False


def _external_findings(ctx: LintContext, filename: str) -> list[Finding]:
    """Findings that point into a launch config (YAML) rather than the script."""
    out = []
    texts: dict[str, tuple[list[str], NoqaMap]] = {}
    for r in ctx.reports:
        st = r.setting
        if st is None:
            continue
        if st.filename not in texts:
            text = _setting_text(ctx, st.filename)
            texts[st.filename] = (text.splitlines(), NoqaMap(text))
        lines, noqa = texts[st.filename]
        if noqa.suppresses(r.rule.code, (st.line,)):
            continue
        line = lines[st.line - 1] if 0 < st.line <= len(lines) else ""
        col = len(line) - len(line.lstrip()) + 1
        f = _finding(r.rule.code, st.filename, r.message, st.line, col, line)
        if r.severity is not None:
            f.severity = r.severity
        f.end = Position(st.line, len(line) + 1)
        f.related = [x for x in r.related if isinstance(x, Related)]
        out.append(f)
    return out


def _setting_text(ctx: LintContext, filename: str) -> str:
    """The text of the file a launch setting was read from: the launch config, the tool job, or the file."""
    launch = getattr(ctx.analysis, "launch", None)
    if launch is not None:
        text = launch.text_of(filename)
        if text:
            return text
    job = ctx.options.get("job")
    if job is not None and job.filename == filename:
        return job.text
    try:
        return Path(filename).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def _selected_fixes(findings: list[Finding], mode: str) -> list[Finding]:
    allowed = {Applicability.SAFE} | ({Applicability.UNSAFE} if mode == "unsafe" else set())
    return [f for f in findings if f.fix is not None and f.fix.applicability in allowed and f.fix.edits]


def _traceback() -> str:
    import traceback

    return traceback.format_exc()


def _newer_fstring(se: SyntaxError) -> bool:
    """An f-string this interpreter rejects but Python >= 3.12 accepts (PEP 701: `f"{d["k"]}"`): libcst decides."""
    return sys.version_info < (3, 12) and (se.msg or "").startswith("f-string")


def fix_text(text: str, filename: str, settings: Settings, path: Optional[Path], fcfg: FileConfig) -> tuple[str, int, list[Finding], Optional[str]]:
    """Apply fixes to a fixpoint (bounded). Returns (text, fixes applied, remaining findings, error).

    All or nothing: when a pass produces code that does not parse, or the passes do not
    converge, the original text and its findings come back with the error.
    """
    applied = 0
    findings = lint_text(text, filename, settings, path, fcfg)
    original, original_findings, codes = text, findings, set()
    for _ in range(MAX_FIX_PASSES):
        todo = _selected_fixes(findings, settings.fix or "safe")
        if not todo:
            break
        edits, taken, used = [], [], []
        for f in sorted(todo, key=lambda f: f.sort_key()):
            spans = [((e.start.row, e.start.column), (e.end.row, e.end.column)) for e in f.fix.edits]
            if any(not (b[1] <= s[0] or s[1] <= b[0]) and not (s[0] == s[1] == b[0] == b[1]) for s in spans for b in used):
                continue  # overlaps an edit already taken: next pass
            used.extend(spans)
            edits.extend(f.fix.edits)
            taken.append(f.code)
        new_text = apply_edits(text, edits)
        try:
            # CPython's verdict first (it also bounds nesting before libcst's native parser sees it).
            ast.parse(new_text, filename=filename)
            cst.parse_module(new_text)
        except Exception as e:
            return original, 0, original_findings, (
                f"a fix of {', '.join(sorted(set(taken)))} produced code that does not parse "
                f"({type(e).__name__}); the file was left unchanged")
        if new_text == text:
            break
        text = new_text
        applied += len(taken)
        codes.update(taken)
        findings = lint_text(text, filename, settings, path, fcfg)
    else:
        if _selected_fixes(findings, settings.fix or "safe"):
            return original, 0, original_findings, (
                f"fixes of {', '.join(sorted(codes))} did not converge after {MAX_FIX_PASSES} passes; "
                f"the file was left unchanged")
    return text, applied, findings, None


def lint_launch_yaml(text: str, filename: str, settings: Settings, fcfg: FileConfig,
                     path: Optional[Path] = None) -> list[Finding]:
    """An accelerate config on its own: the rules that need only launch settings (and the jobs that
    launchers start with it through a training tool's command-line flags)."""
    from dataclasses import replace

    from fsdplint.errors import UsageError
    from fsdplint.launch.settings import parse_accelerate_config

    if "distributed_type" not in text and "fsdp_config" not in text:
        return []  # not an accelerate config: not ours to judge
    try:
        facts = parse_accelerate_config(text, filename)
    except UsageError as e:
        msg = str(e)
        row = 1
        head = msg.split(": ", 1)[0]
        if head.rsplit(":", 1)[-1].isdigit():
            row = int(head.rsplit(":", 1)[-1])
        return [_finding(SYNTAX_ERROR, filename, msg.split(": ", 1)[-1], row)] if SYNTAX_ERROR in fcfg.codes else []
    if facts is None:
        return []
    yaml_settings = replace(settings, options={**settings.options, "launch": facts}, prefilter=False)
    out = [f for f in lint_text("", filename, yaml_settings, path, fcfg) if f.filename == filename]
    if path is not None and facts.uses_fsdp and settings.options.get("discover_launch", True):
        from fsdplint.launch.tools.jobs import jobs_launched_with

        for job in jobs_launched_with(path, facts, settings.options.get("project_root"),
                                      lambda p: _library_versions(p, settings, fcfg),
                                      explicit=settings.targets, use_installed=settings.use_installed,
                                      given=settings.options.get("launches")):
            out.extend(_lint_job(job, Path(job.filename), settings, fcfg))
    return out


def lint_tool_yaml(text: str, filename: str, settings: Settings, fcfg: FileConfig, path: Optional[Path]) -> list[Finding]:
    """An axolotl / LLaMA-Factory config: the rules' job side, and their launch side on its FSDP settings."""
    from fsdplint.launch.tools.read import read_job
    from fsdplint.launch.tools.jobs import launch_for_job

    job = read_job(text, filename, path=path, explicit=settings.targets, use_installed=settings.use_installed,
                   versions=_library_versions(path, settings, fcfg))
    if job is None:
        return []
    if path is not None and settings.options.get("discover_launch", True):
        launch_for_job(job, path, settings.options.get("project_root"))
    return _lint_job(job, path, settings, fcfg)


def _library_versions(path: Optional[Path], settings: Settings, fcfg: FileConfig) -> dict:
    """The versions a tool's own behaviour depends on, resolved as for the rules."""
    from fsdplint import versions as versions_mod

    source = str(fcfg.config.source.name) if fcfg.config.source else "[tool.fsdplint]"
    return {pkg: versions_mod.resolve(pkg, path, settings.targets, fcfg.config.target_version, source,
                                      settings.use_installed, stop=settings.options.get("project_root"))
            for pkg in ("transformers", "bitsandbytes")}


def _lint_job(job, path: Optional[Path], settings: Settings, fcfg: FileConfig) -> list[Finding]:
    """The rules' job side, and their launch side on the job's FSDP settings."""
    from dataclasses import replace

    options = {**settings.options, "job": job, "launch": job.launch, "discover_launch": False}
    job_settings = replace(settings, options=options, prefilter=False)
    out = lint_text("", job.filename, job_settings, path, fcfg)
    # Findings of the job (its lines) and of the accelerate config it is launched with.
    keep = {job.filename} | ({job.launch.source} if job.launch is not None and job.launch.source else set())
    # ... and those elsewhere that rest on the job's lines (a requirements pin that selects a buggy release).
    return [f for f in out if f.filename in keep or any(r.filename in keep for r in f.related)]


_DEEP_STACK = 512 * 1024 * 1024


def _with_deep_stack(fn, *args):
    """Run `fn` in a thread with a large stack and recursion limit: deeply nested files
    must give a finding, not a crash of the whole run."""
    import threading

    out: list = []

    def target():
        try:
            out.append(("ok", fn(*args)))
        except BaseException as e:  # re-raised in the caller's thread
            out.append(("err", e))

    old_size = threading.stack_size()
    old_limit = sys.getrecursionlimit()
    try:
        threading.stack_size(_DEEP_STACK)
        sys.setrecursionlimit(max(old_limit, 20000))
        t = threading.Thread(target=target, name="fsdplint-lint")
        t.start()
    finally:
        threading.stack_size(old_size)
    t.join()
    sys.setrecursionlimit(old_limit)
    kind, value = out[0]
    if kind == "err":
        raise value
    return value


_GC_TUNED = False


def _tune_gc() -> None:
    """Fewer cyclic-GC passes: syntax trees are freed by reference counting (they hold no cycles), but the
    project view keeps parsed modules alive, and every full pass would walk them all again. The middle
    generation waits for 200 young passes (about 10 million allocations): by then a linted file's trees and
    records have died by reference counting instead of being walked once more (on a 200k-line repository,
    1-2 s of collection less; the cyclic garbage that waits for that pass is some 40 MiB)."""
    global _GC_TUNED
    if not _GC_TUNED:
        import gc

        gc.set_threshold(50_000, 200, 100)
        _GC_TUNED = True


def lint_files(files: list[str], settings: Settings) -> list[FileResult]:
    """Lint the files one after the other in this process, results in the order given. With the project
    view, a file is linted before the project modules it imports: a module that another file's calls reach
    is then parsed whole once, ahead of its own turn, and its own lint reuses that parse (see
    `analysis/index.py`); linted first, its parse would be gone from the bounded tables by the time a far
    caller reaches it, and the part that caller needs parsed again."""
    _new_run()
    if not settings.project or len(files) < 2:
        return relocate([lint_file(f, settings) for f in files])
    from fsdplint.analysis.index import expect

    order = _importers_first(files, settings)
    expect(files)
    out: dict[int, FileResult] = {}
    try:
        for i in order:
            out[i] = lint_file(files[i], settings)
    finally:
        expect(())  # nothing is to come once the run is over, however it ended
    return relocate([out[i] for i in range(len(files))])


def lint_files_parallel(files: list[str], settings: Settings, jobs: int) -> list[FileResult]:
    """`lint_files` in `jobs` worker processes, results in the order given. Each worker takes a run of files
    that follow one another in the importers-first order, so that a module reached by a file of its run is
    parsed once there and its own lint reuses the parse, as in one process. A file belongs to the worker that
    reaches it first (a shared claim per file): a worker whose file's calls reach a module of another run
    that nobody has claimed yet parses it whole and lints it itself, and the other worker skips it; with a
    fixed cut, both would parse it (the reaching one a part, the other one whole for its lint). A module the
    other worker claimed first is parsed here too, but whole and once for every function reached in it
    (`index._claimed`): parts would mean a second parse as soon as another function of it is wanted."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from fsdplint.relocate import relocate

    edges = _import_edges(files, settings) if settings.project else {}
    order = _importers_first(files, settings, edges) if settings.project else list(range(len(files)))
    pieces = _cut(order, [_size(files[i]) for i in order], edges, jobs)
    try:
        mp = multiprocessing.get_context("fork")
    except ValueError:  # platforms without fork
        mp = multiprocessing.get_context()
    # claims[i]: 0 while nobody lints file i, else 1 + the index of the run that lints it.
    claims = mp.Array("i", len(files)) if settings.project and len(pieces) > 1 else None
    out: dict[int, FileResult] = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp, initializer=_share_claims,
                             initargs=(claims,)) as pool:
        for results in pool.map(_lint_run, [files] * len(pieces), pieces, range(len(pieces)),
                                [settings] * len(pieces), chunksize=1):
            out.update(results)
    return relocate([out[i] for i in range(len(files))])


_CLAIMS: list = [None]  # the run's shared claims, in a worker process (see `lint_files_parallel`)


def _share_claims(claims) -> None:
    _CLAIMS[0] = claims


def _lint_run(files: list[str], piece: list[int], run: int, settings: Settings) -> dict[int, FileResult]:
    """One worker's run: the files of `files` at the indices of `piece`, in that order (already importers
    first), the rest as `lint_files`; with shared claims, also the files of other runs it reached first, each
    right after the file whose lint reached it, and none that another worker claimed first."""
    _new_run()
    claims = _CLAIMS[0]
    if not settings.project or len(piece) < 2 and claims is None:
        return {i: lint_file(files[i], settings) for i in piece}
    from fsdplint.analysis.index import expect

    reached: list[int] = []

    def claim(i: int) -> bool:
        if claims is None:
            return True
        with claims.get_lock():
            owner = claims[i]
            if owner == 0:
                claims[i] = owner = run + 1
        if owner != run + 1:
            return False
        if i not in mine:
            mine.add(i)
            reached.append(i)
        return True

    mine = set(piece)
    out: dict[int, FileResult] = {}
    if claims is None:
        expect([files[i] for i in piece])
    else:
        expect(files, claim)
    try:
        for i in piece:
            if i in out or not claim(i):
                continue
            out[i] = lint_file(files[i], settings)
            while reached:
                j = reached.pop(0)
                out[j] = lint_file(files[j], settings)
    finally:
        expect(())
    return out


def _size(filename: str) -> int:
    try:
        return Path(filename).stat().st_size
    except OSError:
        return 0


def _cut(order: list[int], sizes: list[int], edges: dict[int, list[int]], n: int) -> list[list[int]]:
    """`order` cut into at most `n` runs of consecutive files of about equal total size, each cut where the
    fewest imports cross it (within a quarter of a run's size of the even cut): the modules a file imports
    then mostly sit in its own run, and are parsed once there."""
    if n <= 1 or len(order) <= 1:
        return [order]
    pos = {item: k for k, item in enumerate(order)}
    # crossing[k]: imports from a file before position k to one at k or after (prefix sums of +1/-1).
    delta = [0] * (len(order) + 1)
    for i, targets in edges.items():
        for j in targets:
            a, b = sorted((pos[i], pos[j]))
            if a < b:
                delta[a + 1] += 1
                delta[b + 1] -= 1
    crossing, run = [], 0
    for d in delta:
        run += d
        crossing.append(run)
    total = sum(sizes) or 1
    before = [0]
    for size in sizes:
        before.append(before[-1] + size)  # before[k]: total size of order[:k]
    cuts, last = [], 0
    for m in range(1, n):
        ideal, slack = total * m / n, total / n / 4
        window = [k for k in range(last + 1, len(order)) if abs(before[k] - ideal) <= slack]
        if not window:
            window = [min(range(last + 1, len(order)), key=lambda k: abs(before[k] - ideal), default=None)]
            if window[0] is None:
                break
        k = min(window, key=lambda k: (crossing[k], abs(before[k] - ideal)))
        cuts.append(k)
        last = k
    bounds = [0, *cuts, len(order)]
    return [order[a:b] for a, b in zip(bounds, bounds[1:]) if a < b]


def _new_run() -> None:
    """What one run found of the file system (dependencies' stamps, where launches run) is looked at again."""
    from fsdplint.launch import shell as launchers

    findings_cache.new_run()
    launchers.new_run()


def _importers_first(files: list[str], settings: Settings, edges: Optional[dict] = None) -> list[int]:
    """Indices of `files`, each file before the files of the run it imports (a reversed depth-first
    post-order of the import graph read off the texts' import lines; cycles broken where met)."""
    edges = _import_edges(files, settings) if edges is None else edges
    post: list[int] = []
    seen: set[int] = set()
    for start in range(len(files)):
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(edges.get(start, ())))]
        while stack:
            node, it = stack[-1]
            nxt = next((j for j in it if j not in seen), None)
            if nxt is None:
                stack.pop()
                post.append(node)
            else:
                seen.add(nxt)
                stack.append((nxt, iter(edges.get(nxt, ()))))
    return post[::-1]


def _import_edges(files: list[str], settings: Settings) -> dict[int, list[int]]:
    """Index of a file -> indices of the files of the run it imports (read off its import lines)."""
    from fsdplint.analysis.index import quick_imports

    index: dict[Path, int] = {}
    for i, f in enumerate(files):
        if f.endswith(".py"):
            try:
                index.setdefault(Path(f).resolve(), i)
            except (OSError, RuntimeError):  # RuntimeError: a symlink loop
                continue
    edges: dict[int, list[int]] = {}
    for path, i in index.items():
        project = _project(settings, path)
        text = project.text(path) if project is not None else None
        if not text or "import" not in text:
            continue
        targets = []
        try:
            for local, module, attr, level in quick_imports(text):
                found = project.find_module(path, module, level)
                if found is not None and attr is not None and found.name == "__init__.py":
                    found = project._module_file(found.parent, [attr]) or found  # `from pkg import module`
                j = index.get(found) if found is not None else None
                if j is not None and j != i:
                    targets.append(j)
        except (OSError, RecursionError, ValueError):
            pass
        edges[i] = targets
    return edges


def lint_file(filename: str, settings: Settings, text: Optional[str] = None) -> FileResult:
    """Lint (and with `settings.fix`, fix in memory) one file. `text` is given for stdin."""
    _tune_gc()
    if text is not None:
        _new_run()  # stdin, an editor's buffer: a run of its own
    try:
        cache = _findings_cache(filename, settings) if text is None else None
        if cache is None:
            return _with_deep_stack(_lint_file, filename, settings, text)
        return _cached_lint(cache, filename, settings)
    finally:
        if text is None and settings.project:
            from fsdplint.analysis.index import linted

            linted(Path(filename))


def _findings_cache(filename: str, settings: Settings):
    from fsdplint import findings_cache

    if not settings.use_cache or settings.fix or not settings.project:
        return None
    return findings_cache.for_file(filename, settings, _project(settings, Path(filename)))


def _cached_lint(cache, filename: str, settings: Settings) -> FileResult:
    """The file's findings from the cache when nothing they depend on changed, else linted and stored."""
    from fsdplint import findings_cache

    data = cache.read()
    findings = cache.lookup()
    if findings is not None and data is not None:
        try:
            src = decode(data)
        except SourceError:
            src = None
        if src is not None:
            findings_cache.STATS["hits"] += 1
            return FileResult(filename, findings, source=src)
    findings_cache.STATS["misses"] += 1
    cache.record()
    try:
        res = _with_deep_stack(_lint_file, filename, settings, None)
    except BaseException:
        from fsdplint.analysis import reads

        reads.stop()
        raise
    cache.store(res.findings)
    return res


def _lint_file(filename: str, settings: Settings, text: Optional[str] = None) -> FileResult:
    from fsdplint.context import forget_definitions

    forget_definitions()
    path = Path(filename) if text is None else (Path(filename) if filename != "-" else None)
    src: Optional[SourceFile] = None
    try:
        fcfg = FileConfig(settings, path)
    except Exception as e:
        return FileResult(filename, [_finding(UNREADABLE, filename, f"configuration error: {e}")])
    if text is None:
        try:
            data = Path(filename).read_bytes()
        except OSError as e:
            return FileResult(filename, [_finding(UNREADABLE, filename, f"cannot read the file: {e.strerror or e}")])
        try:
            src = read_notebook(data) if is_notebook(filename) else decode(data)
        except SourceError as e:
            return FileResult(filename, [_finding(UNREADABLE, filename, str(e), e.row or 1)])
        text = src.text
        if isinstance(src, Notebook):
            return _in_cells(_lint_text_of(filename, settings, path, fcfg, src, text), src)
    else:
        src = SourceFile(text, "utf-8", False)
    return _lint_text_of(filename, settings, path, fcfg, src, text)


def _in_cells(res: FileResult, book: Notebook) -> FileResult:
    """A notebook's findings at `cell N`, row in that cell (the joined program's rows are no one's)."""
    for f in res.findings:
        at = book.cell_of(f.start.row) or next(
            (book.cell_of(r) for r in range(f.start.row, 0, -1) if book.cell_of(r)), None)
        if at is None:
            continue
        end = book.cell_of(f.end.row)
        f.cell = at[0]
        shift = f.start.row - at[1]
        f.start = Position(at[1], f.start.column)
        f.end = Position(end[1], f.end.column) if end and end[0] == at[0] else Position(f.end.row - shift, f.end.column)
        f.message = _LINE_REF.sub(lambda m: _cell_line(book, m), f.message)
    return res


_LINE_REF = re.compile(r"\bline (\d+)\b")


def _cell_line(book: Notebook, m) -> str:
    """`line 35` of the joined program, as the notebook shows it: `cell 4, line 2`."""
    at = book.cell_of(int(m.group(1)))
    return f"cell {at[0]}, line {at[1]}" if at else m.group(0)


def _lint_text_of(filename, settings, path, fcfg, src, text) -> FileResult:
    if filename.endswith((".yaml", ".yml")):
        from fsdplint.launch.tools.read import recognise

        if recognise(text, filename) is not None:
            return FileResult(filename, lint_tool_yaml(text, filename, settings, fcfg, path), source=src)
        return FileResult(filename, lint_launch_yaml(text, filename, settings, fcfg, path), source=src)
    try:
        if settings.fix:
            new_text, applied, findings, err = fix_text(text, filename, settings, path, fcfg)
            if new_text != text and src is not None:
                try:
                    src.encode(new_text)
                except UnicodeEncodeError:
                    new_text, applied, findings = text, 0, lint_text(text, filename, settings, path, fcfg)
                    err = f"the fixed code cannot be written in the file's encoding ({src.encoding}); the file was left unchanged"
            res = FileResult(filename, findings, applied, source=src, fix_error=err)
            if new_text != text:
                res.original, res.fixed_text = text, new_text
            return res
        return FileResult(filename, lint_text(text, filename, settings, path, fcfg), source=src)
    except RecursionError:
        return FileResult(filename, [_finding(INTERNAL_ERROR, filename, "the file is too deeply nested to analyse")])
    except Exception as e:
        msg = f"internal error while linting: {type(e).__name__}: {e}".splitlines()[0]
        if settings.show_internal_errors:
            msg += "\n" + _traceback()
        return FileResult(filename, [_finding(INTERNAL_ERROR, filename, msg)])
