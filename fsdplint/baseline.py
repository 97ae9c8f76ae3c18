"""Baselines: record today's findings, then report only new ones.

A finding is keyed by (path, code, normalised source line), not by line
number, so edits elsewhere in the file do not bring recorded findings back.
Keys are counted: if a file had two identical recorded findings and now has
three, one is reported.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from fsdplint.errors import UsageError
from fsdplint.findings import Finding

FORMAT_VERSION = 1


def normalise_line(f: Finding) -> str:
    """The source line with whitespace collapsed; the message where there is no line (audit findings)."""
    line = " ".join(f.source_line.split())
    return line if line else "message: " + " ".join(f.message.split())


def _relpath(filename: str, base: Path) -> str:
    path = Path(filename)
    absolute = path if path.is_absolute() else Path.cwd() / path
    try:
        rel = os.path.relpath(os.path.normpath(absolute), os.path.normpath(base.absolute()))
    except ValueError:  # another drive on Windows
        rel = str(absolute)
    return Path(rel).as_posix()


def _key(f: Finding, base: Path) -> tuple[str, str, str]:
    return (_relpath(f.filename, base), f.code, normalise_line(f))


@dataclass
class Baseline:
    path: Path
    counts: Counter

    def filter(self, findings: Sequence[Finding]) -> tuple[list[Finding], int]:
        """(findings not in the baseline, number suppressed by it)."""
        remaining = Counter(self.counts)
        base = self.path.absolute().parent
        kept, suppressed = [], 0
        for f in sorted(findings, key=Finding.sort_key):
            key = _key(f, base)
            if remaining[key] > 0:
                remaining[key] -= 1
                suppressed += 1
            else:
                kept.append(f)
        return kept, suppressed


def write_baseline(findings: Iterable[Finding], path: Path) -> int:
    """Write `findings` to `path`; returns how many were recorded."""
    path = Path(path)
    base = path.absolute().parent
    counts = Counter(_key(f, base) for f in findings)
    entries = [
        {"path": p, "code": c, "line": line, "count": n}
        for (p, c, line), n in sorted(counts.items())
    ]
    data = {"fsdplint-baseline": FORMAT_VERSION, "findings": entries}
    try:
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{path}: cannot write baseline: {e.strerror or e}") from None
    return sum(counts.values())


def load_baseline(path: Path) -> Baseline:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: baseline file not found (create it with --write-baseline)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read baseline: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}:{e.lineno}:{e.colno}: invalid baseline JSON: {e.msg}") from None
    if not isinstance(data, dict) or "fsdplint-baseline" not in data or not isinstance(data.get("findings"), list):
        raise UsageError(f"{path}: not an fsdplint baseline (write one with --write-baseline)")
    if data["fsdplint-baseline"] != FORMAT_VERSION:
        raise UsageError(f"{path}: unsupported baseline version {data['fsdplint-baseline']!r}")
    counts: Counter = Counter()
    for i, e in enumerate(data["findings"]):
        try:
            key = (str(e["path"]), str(e["code"]), str(e["line"]))
            n = int(e.get("count", 1))
        except (KeyError, TypeError, ValueError):
            raise UsageError(f"{path}: entry {i + 1} of `findings` needs path, code and line") from None
        counts[key] += n
    return Baseline(path, counts)
