"""Which library versions a script targets, and where that answer came from.

Order (first hit wins): explicit `--target-version` / `--torch-version`,
`[tool.fsdplint] target-version`, the project's declared requirement nearest to
the linted file (lock files give the exact version; a range gives its lower
bound, since a range that admits an affected version is affected), the
installed distribution (metadata only, never imported), else the oldest
version the catalog covers.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from packaging.version import InvalidVersion, Version

DEFAULTS = {
    "torch": "2.4",
    "peft": "0.13.0",
    "transformers": "4.45.0",
    "accelerate": "1.0.0",
    "bitsandbytes": "0.43.0",
    "trl": "0.11.0",
}
PACKAGES = tuple(DEFAULTS)

_REQ_FILES = ("requirements*.txt", "requirements/*.txt")
_LOCKS = ("uv.lock", "poetry.lock", "pdm.lock", "pylock.toml")


@dataclass(frozen=True)
class TargetVersion:
    package: str
    version: Version
    source: str  # human readable, e.g. "pyproject.toml: torch>=2.6"

    def describe(self) -> str:
        return f"{self.package} {self.version} ({self.source})"

    def __lt__(self, other: str) -> bool:
        return self.version < Version(other)

    def __ge__(self, other: str) -> bool:
        return self.version >= Version(other)


def parse_version(text: str) -> Optional[Version]:
    try:
        return Version(text.strip().rstrip(".*"))
    except InvalidVersion:
        return None


def lower_bound(specifier: str) -> Optional[Version]:
    """The lowest version a PEP 440 specifier set admits (None if unbounded below)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        spec = SpecifierSet(specifier)
    except InvalidSpecifier:
        return None
    best: Optional[Version] = None
    for s in spec:
        if s.operator in (">=", "==", "~=", ">", "==="):
            v = parse_version(s.version)
            if v is not None and (best is None or v > best):
                best = v
    return best


_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _from_requirement_line(line: str, package: str) -> Optional[tuple[Optional[Version], str]]:
    line = line.split("#", 1)[0].strip()
    if not line or line.startswith(("-", "git+", "http")):
        return None
    m = _NAME_RE.match(line)
    if not m or _norm(m.group(1)) != package:
        return None
    rest = m.group(3).split(";", 1)[0].strip().strip("()")
    if rest.startswith("@"):
        return None
    return lower_bound(rest) if rest else None, line


def _scan_requirements(lines, package: str, where: str) -> Optional[tuple[Optional[Version], str]]:
    for line in lines:
        hit = _from_requirement_line(line, package)
        if hit is not None:
            return hit[0], f"{where}: {hit[1]}"
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _toml(path: Path) -> dict:
    """A pyproject.toml's tables; a broken one declares nothing (the config loader reports it)."""
    from fsdplint.errors import UsageError
    from fsdplint.toml_io import read_toml

    try:
        return read_toml(path)
    except UsageError:
        return {}


def _lock_version(path: Path, package: str) -> Optional[Version]:
    text = _read(path)
    # uv.lock / poetry.lock / pdm.lock / pylock.toml: [[package]] name = "torch" version = "2.6.0"
    for m in re.finditer(r'name\s*=\s*"([^"]+)"\s*\n\s*version\s*=\s*"([^"]+)"', text):
        if _norm(m.group(1)) == package:
            return parse_version(m.group(2))
    return None


def _declared_in_dir(d: Path, package: str) -> Optional[tuple[Optional[Version], str]]:
    for lock in _LOCKS:
        p = d / lock
        if p.is_file():
            v = _lock_version(p, package)
            if v is not None:
                return v, f"{lock}: {package}=={v}"
    pyproject = d / "pyproject.toml"
    if pyproject.is_file():
        data = _toml(pyproject)
        project = data.get("project", {})
        reqs = list(project.get("dependencies", []) or [])
        for extra in (project.get("optional-dependencies", {}) or {}).values():
            reqs.extend(extra or [])
        hit = _scan_requirements(reqs, package, "pyproject.toml")
        if hit:
            return hit
        poetry = data.get("tool", {}).get("poetry", {}).get("dependencies", {}) or {}
        for name, spec in poetry.items():
            if _norm(name) == package:
                s = spec if isinstance(spec, str) else (spec or {}).get("version", "")
                s = s.replace("^", ">=") if s.startswith("^") else s
                return lower_bound(s) if s and s != "*" else None, f"pyproject.toml: {name} = {s!r}"
    for pattern in _REQ_FILES:
        for p in sorted(d.glob(pattern)):
            hit = _scan_requirements(_read(p).splitlines(), package, p.name)
            if hit:
                return hit
    for name in ("setup.cfg", "setup.py"):
        p = d / name
        if p.is_file():
            # install_requires entries and string literals: "torch>=2.6"
            lines = re.findall(r"""["']([^"'\n]+)["']""", _read(p)) if name == "setup.py" else _read(p).splitlines()
            hit = _scan_requirements(lines, package, name)
            if hit:
                return hit
    return None


@functools.lru_cache(maxsize=512)
def _declared(directory: Path, package: str) -> Optional[tuple[Optional[Version], str]]:
    for d in (directory, *directory.parents):
        hit = _declared_in_dir(d, package)
        if hit is not None:
            return hit
        if (d / ".git").exists():
            break
    return None


@functools.lru_cache(maxsize=None)
def _installed(package: str) -> Optional[Version]:
    from importlib import metadata

    try:
        return parse_version(metadata.version(package))
    except metadata.PackageNotFoundError:
        return None


def resolve(
    package: str,
    path: Optional[Path],
    explicit: Mapping[str, str] = {},
    config: Mapping[str, str] = {},
    config_source: str = "[tool.fsdplint]",
    use_installed: bool = True,
) -> TargetVersion:
    if package in explicit:
        v = parse_version(explicit[package])
        if v is not None:
            return TargetVersion(package, v, "--target-version")
    if package in config:
        v = parse_version(str(config[package]))
        if v is not None:
            return TargetVersion(package, v, config_source)
    if path is not None:
        hit = _declared(path.resolve().parent, package)
        if hit is not None:
            v, where = hit
            if v is None:
                return TargetVersion(package, Version(DEFAULTS[package]), f"{where}, no lower bound: assumed the oldest covered")
            return TargetVersion(package, v, where)
    if use_installed:
        v = _installed(package)
        if v is not None:
            return TargetVersion(package, Version(f"{v.major}.{v.minor}.{v.micro}"), "installed")
    return TargetVersion(package, Version(DEFAULTS[package]), "default: the oldest version fsdplint covers")
