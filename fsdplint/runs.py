"""One lint per launch: a script run by several launchers is checked under each.

A run is the script with one launch's arguments and launch config, or with its own defaults when no
launcher runs it. Findings that every launch gives (and the defaults too) are reported once as they
are; the others say which launch gives them ('when launched by scripts/sft_qlora.sh:14'). A finding
inside an `if` on a parsed argument says on which condition it happens; one in a branch the known
values rule out is not reported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from fsdplint.findings import Finding, Position, Related


@dataclass
class Run:
    launch: Optional[object] = None  # fsdplint.launchers.Launch; None: the script's own defaults

    @property
    def label(self) -> str:
        return self.launch.label if self.launch is not None else "the script's defaults"


def runs_for(path: Optional[Path], filename: str, options) -> list[Run]:
    """The launches that run this file: from `--launch` when given, else the project's shell scripts."""
    from fsdplint import launchers

    given = options.get("launches")
    if given is not None:
        target = path if path is not None else Path(filename)
        return [Run(l) for l in given if launchers.runs_script(l, target)]
    if path is None or not options.get("discover_launch", True):
        return []
    return [Run(l) for l in launchers.launches_for(path, options.get("project_root"))]


def base_dirs(run: Optional[Run], path: Optional[Path]) -> tuple:
    """Where the files a launch names (config files, recipes) are looked up."""
    out = []
    launch = run.launch if run is not None else None
    if launch is not None and getattr(launch, "path", None):
        out.append(str(Path(launch.path).parent))
    if path is not None:
        from fsdplint.launchers import project_root

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
                launch = by_label[label].launch
                if launch.file != f.filename or launch.line != f.start.row:
                    lines = launch.text.splitlines()
                    line = lines[launch.line - 1] if 0 < launch.line <= len(lines) else ""
                    col = len(line) - len(line.lstrip()) + 1
                    f.related.append(Related(launch.file, Position(launch.line, col), Position(launch.line, len(line) + 1),
                                             "the launch that leads to this finding"))
            head, sep, last = f.message.rpartition(" (when ")
            if sep and last.endswith(")") and "(" not in last:
                f.message = f"{head} (when {last[:-1]}; {launched})"
            else:
                f.message = f"{f.message} ({launched})"
        out.append(f)
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
        spans.append((b0.row, b1.row, True not in truth, holds))
        if node.orelse is not None:
            o0, o1 = pos.range(node.orelse)
            fails = (f"when not ({test})" if comparison else f"when {test} is false") + f", line {if_line}"
            spans.append((o0.row, o1.row, False not in truth, fails))

    def note(row: int) -> tuple[bool, str]:
        inside = [s for s in spans if s[0] <= row <= s[1]]
        if any(s[2] for s in inside):
            return True, ""
        if not inside:
            return False, ""
        return False, " (" + "; ".join(s[3] for s in sorted(inside, key=lambda s: s[0])) + ")"

    return note
