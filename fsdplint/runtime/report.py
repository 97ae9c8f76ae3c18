"""Merge per-rank findings into one report and render it."""

from __future__ import annotations

from fsdplint.findings import Finding, finding_from_json
from fsdplint.runtime.consistency import ranges


def merge(per_rank: list[tuple[int, list[dict]]], world_size: int) -> list[Finding]:
    """One finding per (code, message); notes say which ranks reported it."""
    seen: dict[tuple[str, str], tuple[Finding, list[int]]] = {}
    for rank, items in per_rank:
        for d in items:
            key = (d["code"], d["message"])
            if key not in seen:
                seen[key] = (finding_from_json(d), [])
            seen[key][1].append(rank)
    out = []
    for f, ranks in seen.values():
        f.notes["ranks"] = "all" if len(set(ranks)) == world_size else ranges(ranks)
        out.append(f)
    return sorted(out, key=lambda f: (f.severity.rank, f.code, f.message))


def render(findings: list[Finding], world_size: int) -> str:
    """Text in the linter's `file:row:col: CODE message` form, plus the ranks."""
    if not findings:
        return "fsdplint: no findings"
    lines = []
    for f in findings:
        ranks = f.notes.get("ranks", "")
        where = "" if world_size == 1 else (" [all ranks]" if ranks == "all" else f" [ranks {ranks}]")
        lines.append(
            f"{f.filename}:{f.start.row}:{f.start.column}: {f.code} [{f.severity.value}] {f.name}: "
            f"{f.message}{where}"
        )
    errors = sum(f.severity.value == "error" for f in findings)
    lines.append(
        f"fsdplint: {len(findings)} finding{'s' if len(findings) != 1 else ''} "
        f"({errors} error{'s' if errors != 1 else ''}) on {world_size} rank{'s' if world_size != 1 else ''}"
    )
    return "\n".join(lines)
