"""One lint per launch: a script run by several launchers is checked under each.

A run is the script with one launch's arguments and launch config, or with its own defaults when no
launcher runs it. Findings that every launch gives (and the defaults too) are reported once as they
are; the others say which launch gives them ('when launched by scripts/sft_qlora.sh:14'). A finding
inside an `if` on a parsed argument says on which condition it happens; one in a branch the known
values rule out is not reported.

An opt-in flag (`--use_fsdp` with `action="store_true"`, a bool dataclass field defaulting to False) is
not code that cannot run: it exists to be passed. When a run leaves such flags at their default and a
branch is impossible only because of them, the file is linted once more with those flags free; what
only that run gives is a warning at most and names the flags it needs ('when launched with
`--use_fsdp --use_lora`', 'when launched by run_fsdp.sh:3 with `--use_4bit`'). Errors stay decided by
the defaults and the launches.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from fsdplint.findings import Finding, Position, Related, Severity


@dataclass
class Run:
    launch: Optional[object] = None  # fsdplint.launch.shell.Launch; None: the script's own defaults
    free: frozenset = frozenset()  # opt-in flags (option strings) this run lets take either value

    @property
    def label(self) -> str:
        return self.launch.label if self.launch is not None else "the script's defaults"


def runs_for(path: Optional[Path], filename: str, options) -> list[Run]:
    """The launches that run this file: from `--launch` when given, else the project's shell scripts."""
    from fsdplint.launch import shell as launchers

    given = options.get("launches")
    if given is not None:
        target = path if path is not None else Path(filename)
        return [Run(l) for l in given if launchers.runs_script(l, target)]
    if path is None:
        return []
    # A launcher named on the command line launches the scripts it runs (the others keep their own).
    named = [Run(l) for l in options.get("launcher_launches", ()) if launchers.runs_script(l, path)]
    if named or not options.get("discover_launch", True):
        return named
    return [Run(l) for l in launchers.launches_for(path, options.get("project_root"))]


def candidate_runs(path: Optional[Path], text: str, options, use_installed: bool = True, find_module=None) -> list[Run]:
    """With no launcher running the script (and no `--launch`): one candidate run per lone recipe that fits
    its parser (`fsdplint.launch.recipes`); its findings are merged by `merge_candidates`."""
    if path is None or options.get("launches") is not None or not options.get("discover_launch", True):
        return []
    from fsdplint.launch import shell
    from fsdplint.launch.arguments import parse_definitions
    from fsdplint.launch.recipes import lone_recipes, nearby_files

    try:
        root = shell.project_root(path)
        if not nearby_files(path, root):
            return []  # the usual case: nothing to parse
    except OSError:
        return []
    defs = parse_definitions(text, use_installed, find_module, path.resolve() if find_module is not None else None)
    if defs is None or defs.recipe is not None:
        return []  # the script names its own recipe: that is read already
    out = []
    for recipe in lone_recipes(path, root, defs):
        if shell.mentioned_by_launchers(root, recipe.name):
            continue  # a launcher names it (with another script, or one this reader cannot follow)
        try:
            display = os.path.relpath(recipe)
            if display.startswith(".." + os.sep + ".."):
                display = str(recipe)
            recipe_text = recipe.read_text(encoding="utf-8", errors="replace")
        except (OSError, ValueError):
            continue
        launch = shell.Launch(display, 1, "python", script=str(path), text=recipe_text, recipe=str(recipe))
        out.append(Run(launch))
    return out


def merge_candidates(runs: list[Run], defaults: list[Finding], per_run: list[list[Finding]]) -> list[Finding]:
    """As `merge`, for candidate runs: a finding that rests on a lone recipe's values (not given by the
    script's defaults alone) is at most a warning, and says the launch was inferred from that file."""
    def key(f: Finding) -> tuple:
        return (f.filename, f.start, f.code, f.message)

    # The script may as well run with its defaults (the recipe is a guess): their findings stay as they are.
    base = {key(f) for f in defaults}
    out = list(defaults)
    labels = {r.label: r.launch.file for r in runs}
    for f in merge(runs, defaults, per_run):
        launched = f.notes.get("launched by")
        if key(f) in base or launched is None:
            continue
        out.append(f)
        files = [labels.get(x.strip(), x.strip()) for x in launched.split(", ")]
        inferred = (f"launched with the values of {', '.join(files)}: a launch inferred from that recipe, which fits "
                    f"the script's arguments and which no launcher names; name the launch (a launcher, a documented "
                    f"command or --launch) to confirm it")
        f.message = f.message.replace(f"when launched by {launched}", inferred)
        f.notes["launch inferred from"] = ", ".join(files)
        if f.severity == Severity.ERROR:
            f.severity = Severity.WARNING
    return out


def base_dirs(run: Optional[Run], path: Optional[Path]) -> tuple:
    """Where the files a launch names (config files, recipes) are looked up."""
    out = []
    launch = run.launch if run is not None else None
    if launch is not None and getattr(launch, "path", None):
        out.append(str(Path(launch.path).parent))
    if path is not None:
        from fsdplint.launch.shell import project_root

        try:
            out.append(str(project_root(path)))
        except OSError:
            pass
        out.append(str(path.parent))
    out.append(os.getcwd())
    return tuple(dict.fromkeys(out))


def merge(runs: list[Run], defaults: list[Finding], per_run: list[list[Finding]]) -> list[Finding]:
    """Findings of every launch; those not given by every launch and the defaults name their launches."""
    def key(f: Finding) -> tuple:
        return (f.filename, f.start, f.code, f.message)

    base = {key(f) for f in defaults}
    order: list[tuple] = []
    by_key: dict[tuple, tuple[Finding, list[str]]] = {}
    by_label = {r.label: r for r in runs}
    for run, findings in zip(runs, per_run):
        for f in findings:
            k = key(f)
            if k not in by_key:
                by_key[k] = (f, [])
                order.append(k)
            labels = by_key[k][1]
            if run.label not in labels:
                labels.append(run.label)
    out = []
    every = [r.label for r in runs]
    for k in order:
        f, labels = by_key[k]
        if not (k in base and labels == every):
            launched = f"when launched by {', '.join(labels)}"
            f.notes["launched by"] = ", ".join(labels)
            for label in labels:
                _relate_launch(f, by_label[label].launch)
            _add_condition(f, launched)
        out.append(f)
    return out


def _relate_launch(f: Finding, launch) -> None:
    if launch.file != f.filename or launch.line != f.start.row:
        lines = launch.text.splitlines()
        line = lines[launch.line - 1] if 0 < launch.line <= len(lines) else ""
        col = len(line) - len(line.lstrip()) + 1
        f.related.append(Related(launch.file, Position(launch.line, col), Position(launch.line, len(line) + 1),
                                 "the launch that leads to this finding"))


def _add_condition(f: Finding, cond: str) -> None:
    """Append 'when ...' to the message, inside the branch note it may already end with."""
    head, sep, last = f.message.rpartition(" (when ")
    if sep and last.endswith(")") and "(" not in last:
        f.message = f"{head} (when {last[:-1]}; {cond})"
    else:
        f.message = f"{f.message} ({cond})"


def add_switched(out: list[Finding], extra: list[tuple[Run, list[Finding]]]) -> list[Finding]:
    """`out` (the defaults' or the launches' findings) and what only a run with opt-in flags free gives:
    each a warning at most, saying which flags (and launch) it needs."""
    have = {(f.filename, f.start, f.code) for f in out}
    order: list[tuple] = []
    by_key: dict[tuple, tuple[Finding, list[tuple[Run, str]]]] = {}
    for run, findings in extra:
        for f in findings:
            f.notes.pop("switches refused", None)
            flags = f.notes.pop("switches", None)
            k = (f.filename, f.start, f.code)
            if flags is None or k in have:
                continue
            if k not in by_key:
                by_key[k] = (f, [])
                order.append(k)
            by_key[k][1].append((run, flags))
    added = []
    for k in order:
        f, where = by_key[k]
        if f.severity is Severity.ERROR:
            f.severity = Severity.WARNING
        f.fix = None  # the code also runs without the flags: no edit made for one configuration
        labels = []
        untold = f.notes.pop("switches untold", False)
        for run, flags in where:
            shown = (f"some of `{flags}` (more than four opt-in flags are free, and which of them give this was "
                     f"not tried: declare the launch, e.g. --launch, to decide)") if untold else f"`{flags}`"
            if run.launch is not None:
                labels.append(f"{run.launch.label} with {shown}")
                _relate_launch(f, run.launch)
            else:
                labels.append(shown)
        f.notes["opt-in flags"] = "; ".join(flags for _, flags in where)
        if all(run.launch is None for run, _ in where):
            _add_condition(f, f"when launched with {', '.join(labels)}")
        else:
            f.notes["launched by"] = ", ".join(labels)
            _add_condition(f, f"when launched by {', '.join(labels)}")
        added.append(f)
    return out + added


def needed_switches(ctx, f: Finding, free: frozenset, rows: tuple = ()) -> Optional[str]:
    """The opt-in flags of `free` a finding of a run with them free needs: those read by the `if`s around
    its line and its related places that cannot run with the flags at their default (the fewest that open
    each). `rows`: other lines of the file the finding depends on. None when those flags shut another of
    these branches (`--load_in_4bit` and `--load_in_8bit` on an `if`/`elif`), or when the places sit in
    the two branches of one `if`: no run gives the finding."""
    a = ctx.analysis
    if getattr(a, "env", None) is None:
        return None
    guards, branch_of = [], {}
    places = [(f.filename, f.start.row)] + [(f.filename, r) for r in rows] + [(r.filename, r.start.row) for r in f.related]
    for filename, row in places:
        for g in _guards_at(ctx, a, filename, row):
            if branch_of.setdefault(id(g[0]), g[2]) != g[2]:
                return None  # one place in the body, another in the `else`
            if a.test_truth(g[0], g[1]) is not None:
                guards.append(g)
    on = a.env.switches

    def pins(chosen) -> dict:
        out = {}
        for x in free:
            vals = a._switch_values(x)
            out[x] = (on.get(x, True),) if x in chosen else tuple(v for v in vals if v != on.get(x, True)) or vals
        return out

    def opens(g, chosen) -> bool:
        node, scope, want = g
        t = a.switched_truth(node, scope, pins(chosen))
        return t is None or want in t

    needed: list[str] = []
    for g in guards:
        mine = [x for x in sorted(a.switches(g[0].test, g[1])) if x in free]
        if not mine or opens(g, needed):
            continue
        one = next((x for x in mine if opens(g, needed + [x])), None)
        if one is not None:
            needed.append(one)
        elif opens(g, needed + mine):
            needed.extend(x for x in mine if x not in needed)
    if any(not opens(g, needed) for g in guards):
        return None
    if needed and _refused(ctx, a, pins(needed)):
        return None
    f.notes["switches refused"] = lambda flags: _refused(ctx, a, pins(flags))  # for `told_apart`
    if not needed:
        f.notes["switches guessed"] = True  # no `if` on the flags around its places: see `told_apart`
        needed = sorted(free)
    return " ".join(sorted(needed))


def told_apart(run: Run, findings: list[Finding], lint: Callable[[Run], list[Finding]]) -> list[Finding]:
    """With several flags free, check each finding against a run with only the flags it names free: the
    `if`s around its places may not show them all (a value set under `if args.use_4bit:` and read
    elsewhere, FSDP switched on by another flag), or show none. One more run per set tried, adding one
    flag at a time with at most four free. With more free, a finding whose flags are not told this way is
    kept, saying that it needs some of them and that the launch decides which (not dropped without a word)."""
    guessed = {id(f) for f in findings if f.notes.pop("switches guessed", False)}
    if len(run.free) < 2:
        return findings
    seen: dict[frozenset, set] = {}

    def gives(flags: frozenset, k: tuple) -> bool:
        if flags not in seen:
            seen[flags] = {(g.filename, g.start, g.code) for g in lint(Run(run.launch, flags))
                           if g.notes.get("switches") is not None}
        return k in seen[flags]

    every = " ".join(sorted(run.free))
    for f in findings:
        named = f.notes.get("switches")
        if named is None or (named == every and id(f) not in guessed):
            continue
        k = (f.filename, f.start, f.code)
        claimed = frozenset() if id(f) in guessed else frozenset(named.split())
        if claimed and gives(claimed, k):
            continue
        f.notes["switches"] = None
        if len(run.free) <= 4:
            for extra in sorted(run.free - claimed):
                if gives(claimed | {extra}, k):
                    f.notes["switches"] = " ".join(sorted(claimed | {extra}))
                    break
            else:
                f.notes["switches"] = every
        else:
            f.notes["switches"] = every
            f.notes["switches untold"] = True
        refused = f.notes.get("switches refused")
        if f.notes["switches"] is not None and refused is not None and refused(f.notes["switches"].split()):
            f.notes["switches"] = None  # the script stops on these flags itself
    return findings


def _refused(ctx, a, pins: dict) -> bool:
    """The script stops on these flags itself: `if args.load_in_8bit and args.use_fsdp: raise ...`,
    `parser.error(...)`, `sys.exit(...)`, or an `assert` that fails with them."""
    import libcst as cst

    from fsdplint.resolve import dotted

    scopes = {id(s.node): s for s in a.c.scopes if s.node is not None}

    def stops(block) -> bool:
        first = block.body[0] if isinstance(block, cst.IndentedBlock) and block.body else None
        for small in getattr(first, "body", ()) if isinstance(first, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Raise):
                return True
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                name = dotted(small.value.func) or ""
                if name.endswith(".error") or name in ("sys.exit", "exit", "quit"):
                    return True
        return False

    def walk(body, fn) -> bool:
        for stmt in body:
            scope = scopes.get(id(fn)) if fn is not None else None
            if isinstance(stmt, cst.If):
                if stops(stmt.body) and a.test_truth(stmt, scope) is not None \
                        and a.switched_truth(stmt, scope, pins) == frozenset({True}):
                    return True
                if walk(stmt.body.body, fn):
                    return True
            elif isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Assert) and a.test_truth(small, scope) is not None \
                            and a.switched_truth(small, scope, pins) == frozenset({False}):
                        return True
            elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and isinstance(stmt.body, cst.IndentedBlock):
                if walk(stmt.body.body, stmt if isinstance(stmt, cst.FunctionDef) else fn):
                    return True
        return False

    try:
        return walk(ctx.module.body, None)
    except RecursionError:
        return False


def _guards_at(ctx, a, filename: str, row: int) -> list[tuple]:
    """(If node, its scope, the branch wanted: True for the body) of each `if` around a line, outermost
    first."""
    import libcst as cst

    if filename == ctx.filename:
        module, pos, scopes = ctx.module, ctx.positions, {id(s.node): s for s in a.c.scopes if s.node is not None}
    else:
        fm = next((m for m in getattr(a, "_foreign_mods", ()) if m.display == filename), None)
        if fm is None:
            return []
        module, pos, scopes = fm.module, fm.positions, fm.scope_of_def
    out = []

    def walk(body, fn):
        for stmt in body:
            start, end = pos.range(stmt)
            if not (start.row <= row <= end.row):
                continue
            if isinstance(stmt, cst.If):
                b0, b1 = pos.range(stmt.body)
                if b0.row <= row <= b1.row:
                    out.append((stmt, scopes.get(id(fn)) if fn is not None else None, True))
                    walk(stmt.body.body, fn)
                elif stmt.orelse is not None and pos.range(stmt.orelse)[0].row <= row:
                    out.append((stmt, scopes.get(id(fn)) if fn is not None else None, False))
                    walk([stmt.orelse] if isinstance(stmt.orelse, cst.If) else stmt.orelse.body.body, fn)
            elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef, cst.For, cst.While, cst.With, cst.Try)):
                if isinstance(stmt.body, cst.IndentedBlock):
                    walk(stmt.body.body, stmt if isinstance(stmt, cst.FunctionDef) else fn)
                for extra in ([*stmt.handlers, stmt.orelse, stmt.finalbody] if isinstance(stmt, cst.Try) else
                              [stmt.orelse] if isinstance(stmt, (cst.For, cst.While)) else []):
                    if extra is not None and isinstance(getattr(extra, "body", None), cst.IndentedBlock):
                        walk(extra.body.body, fn)

    try:
        walk(module.body, None)
    except Exception:  # a node the positions do not know: no guards told
        return []
    return out


def branch_notes(ctx) -> Optional[Callable[[int], tuple[bool, str]]]:
    """For a finding's line: (in a branch that cannot run, the conditions it runs under)."""
    a = ctx.analysis
    if getattr(a, "env", None) is None:
        return None
    conds = a.env_conditions()
    if not conds:
        return None
    import libcst as cst

    pos = ctx.positions
    spans = []
    for node, test, truth in conds:
        if_line = pos.range(node)[0].row
        comparison = isinstance(node.test, (cst.Comparison, cst.BooleanOperation))
        b0, b1 = pos.range(node.body)
        holds = (f"when {test}" if comparison else f"when {test} is true") + f", line {if_line}"
        spans.append((b0.row, b1.row, True not in truth, holds, node, True))
        if node.orelse is not None:
            o0, o1 = pos.range(node.orelse)
            fails = (f"when not ({test})" if comparison else f"when {test} is false") + f", line {if_line}"
            spans.append((o0.row, o1.row, False not in truth, fails, node, False))

    def note(row: int) -> tuple[bool, str]:
        inside = [s for s in spans if s[0] <= row <= s[1]]
        if any(s[2] for s in inside):
            for s in inside:
                if s[2]:  # an opt-in flag at its default may be what rules the branch out
                    a.note_switched_off(s[4], a._scope_of_if.get(id(s[4])), s[5])
            return True, ""
        if not inside:
            return False, ""
        return False, " (" + "; ".join(s[3] for s in sorted(inside, key=lambda s: s[0])) + ")"

    return note
