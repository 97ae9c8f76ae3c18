"""Advisory entries and their loader: every file under `data/` is read and checked when first needed."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from fsdplint.advisories import predicate
from fsdplint.errors import UsageError

DATA = Path(__file__).with_name("data")
LIBRARIES = ("torch", "transformers", "peft", "trl", "accelerate", "bitsandbytes", "axolotl", "llamafactory")
# Where a finding is reported: the fact whose setting is written in the job.
_REQUIRED = ("id", "summary", "library", "when", "report_at", "error", "fix", "citations", "boundaries", "example")


@dataclass(frozen=True)
class Boundary:
    release: str  # a release that was read
    affected: bool  # whether the bug is in it
    read: str  # what was read there (file, function)


@dataclass(frozen=True)
class Advisory:
    id: str
    summary: str
    library: str
    introduced: Optional[Version]  # first affected release; None: every release fsdplint covers
    fixed: Optional[Version]  # first release without the bug; None: not fixed yet
    when: Mapping[str, Any]
    report_at: str
    error: str
    fix: str
    citations: tuple[str, ...]
    boundaries: tuple[Boundary, ...]
    verified: bool  # both boundaries read at the two adjacent releases; an unverified entry only ever warns
    example: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    # "warning" for a bug that degrades a run (slower, numerically different) rather than breaking it.
    severity: str = "error"
    # The library functions (dotted names) the bug is reached through: a training tool that replaces them
    # with its own (axolotl's FSDP2 patch of accelerate) does not run the code with the bug.
    reached_through: tuple[str, ...] = ()

    @property
    def affected(self) -> SpecifierSet:
        parts = ([f">={self.introduced}"] if self.introduced else []) + ([f"<{self.fixed}"] if self.fixed else [])
        return SpecifierSet(",".join(parts))

    def describe_range(self) -> str:
        if self.introduced and self.fixed:
            return f"{self.library} {self.introduced} to before {self.fixed}"
        if self.fixed:
            return f"{self.library} before {self.fixed}"
        if self.introduced:
            return f"{self.library} {self.introduced} and later (not fixed yet)"
        return f"every {self.library} release (not fixed yet)"

    def applies_to(self, version: Version) -> bool:
        return self.affected.contains(version, prereleases=True)

    def as_dict(self) -> dict:
        return {
            "id": self.id, "summary": self.summary, "library": self.library,
            "introduced": str(self.introduced) if self.introduced else None,
            "fixed": str(self.fixed) if self.fixed else None,
            "affected": str(self.affected) or "*", "when": dict(self.when), "report_at": self.report_at,
            "error": self.error, "fix": self.fix, "citations": list(self.citations), "verified": self.verified, "severity": self.severity, "reached_through": list(self.reached_through),
            "boundaries": [{"release": b.release, "affected": b.affected, "read": b.read} for b in self.boundaries],
        }


def _version(raw: Any, what: str) -> Optional[Version]:
    if raw in (None, ""):
        return None
    try:
        return Version(str(raw))
    except InvalidVersion:
        raise ValueError(f"`{what}`: not a release number: {raw!r}") from None


def parse(data: Mapping[str, Any], source: str) -> Advisory:
    """An advisory from one file's table; ValueError (without the file name) when it is malformed."""
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ValueError(f"missing field(s): {', '.join(missing)}")
    unknown = [k for k in data if k not in _REQUIRED + ("introduced", "fixed", "verified", "severity", "reached_through")]
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(unknown)}")
    if data["library"] not in LIBRARIES:
        raise ValueError(f"`library`: {data['library']!r} is none of {', '.join(LIBRARIES)}")
    introduced, fixed = _version(data.get("introduced"), "introduced"), _version(data.get("fixed"), "fixed")
    if introduced and fixed and fixed <= introduced:
        raise ValueError(f"`fixed` ({fixed}) is not after `introduced` ({introduced})")
    try:
        predicate.validate(data["when"])
        for lib, spec in data["when"].get("versions", {}).items():
            if lib not in LIBRARIES:
                raise ValueError(f"`when.versions`: unknown library {lib!r}")
            SpecifierSet(spec)
    except predicate.PredicateError as e:
        raise ValueError(str(e)) from None
    except InvalidSpecifier as e:
        raise ValueError(f"`when.versions`: {e}") from None
    if data["report_at"] not in data["when"]:
        raise ValueError(f"`report_at` ({data['report_at']!r}) must name a fact of `when`")
    cites = data["citations"]
    if not isinstance(cites, list) or not cites or not all(isinstance(c, str) and c.startswith("http") for c in cites):
        raise ValueError("`citations` must be a non-empty list of URLs")
    bounds = []
    for b in data["boundaries"]:
        if not isinstance(b, dict) or set(b) != {"release", "affected", "read"}:
            raise ValueError("each `boundaries` entry needs exactly release, affected and read")
        _version(b["release"], "boundaries.release")
        bounds.append(Boundary(str(b["release"]), bool(b["affected"]), str(b["read"])))
    verified = bool(data.get("verified", False))
    severity = data.get("severity", "error")
    if severity not in ("error", "warning"):
        raise ValueError(f"`severity`: {severity!r} is neither error nor warning")
    if verified:
        # A verified boundary was read on both sides: the last affected release and the first fixed one.
        for edge, want in ((introduced, True), (fixed, False)):
            if edge is not None and not any(Version(b.release) == edge and b.affected is want for b in bounds):
                raise ValueError(f"`verified` needs the release {edge} read in `boundaries`")
            if edge is not None and not any(Version(b.release) < edge and b.affected is not want for b in bounds):
                raise ValueError(f"`verified` needs the release before {edge} read in `boundaries`")
    through = data.get("reached_through", [])
    if not isinstance(through, list) or not all(isinstance(t, str) and "." in t for t in through):
        raise ValueError("`reached_through` must be a list of dotted function names")
    ex = data["example"]
    if not isinstance(ex, dict) or not isinstance(ex.get("code"), str) or not isinstance(ex.get("line"), int):
        raise ValueError("`example` needs `code` (a script that triggers it) and `line` (where it is reported)")
    return Advisory(
        id=str(data["id"]), summary=str(data["summary"]), library=data["library"], introduced=introduced,
        fixed=fixed, when=data["when"], report_at=data["report_at"], error=str(data["error"]),
        fix=str(data["fix"]), citations=tuple(cites), boundaries=tuple(bounds), verified=verified,
        example=ex, source=source, severity=severity, reached_through=tuple(through),
    )


def load_file(path: Path) -> Advisory:
    from fsdplint.toml_io import read_toml

    data = read_toml(path)
    try:
        adv = parse(data, path.name)
    except (ValueError, TypeError) as e:
        raise UsageError(f"{path}: invalid advisory: {e}") from None
    if adv.id != path.stem:
        raise UsageError(f"{path}: invalid advisory: `id` ({adv.id}) must be the file's name")
    return adv


@functools.lru_cache(maxsize=None)
def load(directory: Optional[Path] = None) -> tuple[Advisory, ...]:
    """Every advisory, sorted by id."""
    d = directory or DATA
    return tuple(load_file(p) for p in sorted(d.glob("*.toml")))
