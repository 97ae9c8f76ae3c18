"""A finding caused by a statement of another module is reported at the call in the linted file that
runs it (the other module alone may not show the cause: nothing there loads a 4-bit model). When that
other module is linted in the same run, the finding belongs to the faulty statement: it is reported
there, once however many callers reach it, with the calls as related locations."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Optional

from fsdplint.findings import Finding, Related

LAUNCH_NOTE = "the launch that leads to this finding"  # (fsdplint.launch.runs names each launch so)

# Finding.notes keys the engine sets on a finding reported at a call for a statement of another module.
CAUSE = "caused at"  # the Related location of the faulty statement
OWN_MESSAGE = "message at the cause"  # the message without the "(in other.py:N)" the caller's copy carries


def _key(name: str) -> Optional[Path]:
    try:
        return Path(name).resolve()
    except (OSError, RuntimeError, ValueError):
        return None


def _line(path: Path, row: int) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return lines[row - 1] if 0 < row <= len(lines) else ""


def relocate(results: list) -> list:
    """`results` (engine FileResults, in order) with each finding caused in another linted file moved there."""
    by_path = {}
    for r in results:
        k = _key(r.filename)
        if k is not None and r.filename != "-":
            by_path.setdefault(k, r)
    moved: dict[tuple, Finding] = {}
    for r in results:
        keep = []
        for f in r.findings:
            cause = f.notes.get(CAUSE)
            target = by_path.get(_key(cause.filename)) if isinstance(cause, Related) else None
            if target is None or target is r:
                keep.append(f)
                continue
            # (the lines the message names are the caller's: it was written for the caller's file)
            call = Related(f.filename, f.start, f.end, f"the call that runs it (lines the message names are {f.filename}'s)")
            k = (target.filename, cause.start, f.code)
            if k in moved and f.severity.rank >= moved[k].severity.rank:
                if call not in moved[k].related:
                    moved[k].related.append(call)
                continue
            earlier = moved.get(k)  # a less severe finding of the same place (another launch's, undecided)
            f.notes.pop(CAUSE, None)
            f.filename, f.start, f.end = target.filename, cause.start, cause.end
            f.message = f.notes.pop(OWN_MESSAGE, f.message)
            f.related = [call, *(x for x in f.related if x != cause)]
            f.source_line = _line(Path(target.filename), cause.start.row)
            if earlier is not None:
                f.related.extend(x for x in earlier.related if x not in f.related and not _launch_note(x))
            moved[k] = f
    for r in results:
        r.findings = [f for f in r.findings if not (f.notes.get(CAUSE) is not None and _key(
            f.notes[CAUSE].filename) in by_path and by_path[_key(f.notes[CAUSE].filename)] is not r)]
    for r in results:
        for f in r.findings:  # (a cause outside the linted files stays at the call: the markers go)
            f.notes.pop(CAUSE, None)
            f.notes.pop(OWN_MESSAGE, None)
    _gather_foreign(results, by_path)
    for (filename, start, code), f in moved.items():
        target = next(r for r in results if r.filename == filename)
        same = next((g for g in target.findings if g.code == code and g.start == start), None)
        if same is not None and f.severity.rank < same.severity.rank:
            # The module's own lint left it undecided (a warning) where a caller's launch decides it: the
            # decided one stands, the module's own calls related.
            f.related.extend(x for x in same.related if x not in f.related and not _launch_note(x))
            target.findings[target.findings.index(same)] = f
        elif same is not None:  # the module's own lint found it too: one finding, with the calls related
            same.related.extend(x for x in f.related if x not in same.related)
        else:
            target.findings.append(f)
            target.findings.sort(key=lambda g: g.sort_key())
    return results


def _launch_note(x: Related) -> bool:
    """A related location naming a launch that gave the less severe finding (not the one that stands)."""
    return x.message == LAUNCH_NOTE


def _shown(name: str, cwd: str) -> str:
    """An absolute path below the working directory as findings name files: relative to it."""
    if os.path.isabs(name) and (name + os.sep).startswith(cwd + os.sep):
        return os.path.relpath(name, cwd)
    return name


def _gather_foreign(results: list, by_path: dict) -> None:
    """A finding a file's lint reports in another file (a launch read from a document leads to findings in the
    accelerate config it names) is named as that file is named, and belongs to that file's result when it is
    linted in the same run: one finding per code and place there, the other's launches as related locations."""
    try:
        cwd = str(Path.cwd().resolve())
    except OSError:
        return
    placed: dict[tuple, Finding] = {}  # a finding named in a file nothing in this run lints: the first of its place
    for r in results:
        keep = []
        for f in r.findings:
            if os.path.isabs(f.filename) or any(os.path.isabs(x.filename) for x in f.related):
                prefix = cwd + os.sep
                f.filename = _shown(f.filename, cwd)
                f.related = [replace(x, filename=_shown(x.filename, cwd)) for x in f.related]
                f.message = f.message.replace(prefix, "")
            target = by_path.get(_key(f.filename)) if f.filename != r.filename else None
            if target is None and f.filename != r.filename:
                # Two linted files can lead to the same finding in a third file that is not linted (two
                # documents launching one config that a requirement pin decides): one finding, the other's
                # launches as related locations.
                place = (f.filename, f.cell, f.start, f.code)
                first = placed.get(place)
                if first is not None:
                    first.related.extend(x for x in f.related if x not in first.related)
                    continue
                placed[place] = f
            if target is None or target is r:
                keep.append(f)
                continue
            same = next((g for g in target.findings if g.code == f.code and g.start == f.start), None)
            if same is None:
                f.filename = target.filename
                target.findings.append(f)
                target.findings.sort(key=lambda g: g.sort_key())
            else:
                same.related.extend(x for x in f.related if x not in same.related)
        r.findings = keep
