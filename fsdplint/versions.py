"""Which library versions a script targets, and where that answer came from.

Order (first hit wins): explicit `--target-version` / `--torch-version`,
`[tool.fsdplint] target-version`, a lock file of the project the linted file
belongs to (the exact version), the project's declared requirement nearest to
the file (a range gives its lower bound, since a range that admits an affected
version is affected), the installed distribution (metadata only, never
imported), what the code itself proves (an unguarded import that exists only
from some release, see `evidence`), else unknown.

The project of a file is found by walking up from it to the nearest directory
with a `pyproject.toml`, `setup.cfg`, `setup.py` or `.git` (its root):
requirement files between the file and that root count, nothing above it does,
and fsdplint's own pyproject (its fixtures, its examples) declares nothing for
the scripts it lints. Without a marker above the file, the directory being
linted (`fsdplint check DIR`) plays the root.

A version that was declared, pinned or installed is *known*; one the code
proves is a lower bound, and an unknown one is the oldest version fsdplint
covers. Rules that depend on a version report a warning, not an error, when it
is not known (unless `strict-versions = true`), and say what to declare.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from packaging.version import InvalidVersion, Version

from fsdplint.roots import has_marker, linted_root

DEFAULTS = {
    "torch": "2.4",
    "peft": "0.13.0",
    "transformers": "4.45.0",
    "accelerate": "1.0.0",
    "bitsandbytes": "0.43.0",
    "trl": "0.11.0",
    "lightning": "2.0.0",
}
PACKAGES = tuple(DEFAULTS)
# Distributions that ship one package under several names, in the order a pin is looked for: Lightning's
# Trainer and Fabric come as `lightning` (both), `pytorch-lightning` and `lightning-fabric`, released together
# with one version number.
ALIASES = {"lightning": ("lightning", "pytorch-lightning", "lightning-fabric")}

_REQ_FILES = ("requirements*.txt", "requirements/*.txt")
_LOCKS = ("uv.lock", "poetry.lock", "pdm.lock", "pylock.toml")


# Where a version came from; the first four are known, "code" is a proven lower bound.
# "checkout": the version a library's own source tree says it is (linting that library's repository). A tree
# between two releases still carries the last release's number, so it is that release or any commit after it.
KNOWN_KINDS = ("explicit", "config", "lock", "declared", "installed", "checkout")


@dataclass(frozen=True)
class TargetVersion:
    package: str
    version: Version
    source: str  # human readable, e.g. "pyproject.toml: torch>=2.6"
    kind: str = "declared"  # one of KNOWN_KINDS, "code" or "unknown"
    line: Optional[int] = None  # for "code": the line of the code that proves it

    @property
    def known(self) -> bool:
        return self.kind in KNOWN_KINDS

    def describe(self) -> str:
        if self.kind == "code":
            return f"{self.package} >= {self.version} ({self.source})"
        return f"{self.package} {self.version} ({self.source})"

    def declare_hint(self, needed: str) -> str:
        """What to declare so that a version-dependent finding can be decided."""
        return (f"declare the {self.package} the project supports (e.g. `{self.package}>={needed}` in its "
                f"requirements) or set `target-version = {{ {self.package} = \"...\" }}` in [tool.fsdplint]")

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


_TOMLS: dict[Path, tuple] = {}  # path -> ((mtime, size), tables): every linted file asks again


def _toml(path: Path) -> dict:
    """A pyproject.toml's tables (read only); a broken one declares nothing (the config loader reports it)."""
    from fsdplint.errors import UsageError
    from fsdplint.toml_io import read_toml

    try:
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None
    hit = _TOMLS.get(path)
    if hit is not None and stamp is not None and hit[0] == stamp:
        return hit[1]
    try:
        data = read_toml(path)
    except UsageError:
        data = {}
    if stamp is not None:
        _TOMLS[path] = (stamp, data)
    return data


def _lock_version(path: Path, package: str) -> Optional[Version]:
    text = _read(path)
    # uv.lock / poetry.lock / pdm.lock / pylock.toml: [[package]] name = "torch" version = "2.6.0"
    for m in re.finditer(r'name\s*=\s*"([^"]+)"\s*\n\s*version\s*=\s*"([^"]+)"', text):
        if _norm(m.group(1)) == package:
            return parse_version(m.group(2))
    return None


def _declared_in_dir(d: Path, package: str) -> Optional[tuple[Optional[Version], str]]:
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


def _is_fsdplint_itself(d: Path) -> bool:
    """fsdplint's own checkout: its requirements are the linter's, not its fixtures' or examples'."""
    p = d / "pyproject.toml"
    if not p.is_file():
        return False
    project = _toml(p).get("project", {})
    return isinstance(project, dict) and project.get("name") == "fsdplint"


@functools.lru_cache(maxsize=512)
def project_dirs(directory: Path, stop: Optional[Path] = None) -> tuple[Path, ...]:
    """The directories from `directory` up to its project's root (inclusive); none above it.
    Empty inside fsdplint's own checkout. Without a root marker above, the directories up to `stop`
    (the directory being linted) when it holds the file, else only the file's own directory."""
    out = []
    for d in (directory, *directory.parents):
        out.append(d)
        if has_marker(d):
            if _is_fsdplint_itself(d):
                return ()
            break
    else:
        # No project root above: the directories up to the linted one when it holds the file; else the
        # nearest directory declaring requirements ends the project (a checkout copied without `.git`:
        # `examples/x/run.sh` below the top's requirements.txt).
        top = linted_root(directory, stop)
        if top is not None:
            return tuple(d for d in (directory, *directory.parents) if d == top or top in d.parents)
        for k, d in enumerate(out[:8]):
            if any(d.glob("requirements*.txt")) or (d / "requirements").is_dir():
                return tuple(out[:k + 1])
        return (directory,)  # only what sits next to the file
    return tuple(out)


_VERSION_ASSIGN = re.compile(r"""^\s*(?:__version__|VERSION|version)\s*(?::\s*str\s*)?=\s*["']([^"'\n]+)["']""", re.M)
_SETUP_NAME = re.compile(r"""\bname\s*=\s*["']([^"'\n]+)["']""")


def _version_in(paths) -> Optional[tuple[Version, str]]:
    for p in paths:
        if not p.is_file():
            continue
        text = _read(p)
        m = _VERSION_ASSIGN.search(text) if p.suffix else None
        raw = m.group(1) if m else (text.strip() if not p.suffix else None)
        v = parse_version(raw) if raw else None
        if v is not None:
            return v, p.name
    return None


def _own_version(d: Path, package: str) -> Optional[tuple[Version, str]]:
    """The version of the library a project *is* (linting trl's own repository: trl is that checkout's
    version): `[project] version`, else the file or `__init__.py`/`version.py` attribute its build reads,
    else setup.py's `version=`/`VERSION =`. A dev release counts as the release it leads to."""
    name = None
    static = None
    pyproject = d / "pyproject.toml"
    if pyproject.is_file():
        project = _toml(pyproject).get("project", {})
        if isinstance(project, dict) and isinstance(project.get("name"), str):
            name = project["name"]
            static = project.get("version")
    setup = d / "setup.py"
    if name is None and setup.is_file():
        m = _SETUP_NAME.search(_read(setup))
        name = m.group(1) if m else None
    if name is None or _norm(name) != _norm(package):
        return None
    found = None
    if isinstance(static, str) and parse_version(static) is not None:
        found = parse_version(static), "pyproject.toml"
    mod = package.replace("-", "_")
    found = found or _dynamic_version(d) or _version_in([d / "VERSION", d / "version.txt"]) or _version_in(
        [d / base / mod / f for base in ("", "src") for f in ("__init__.py", "version.py", "_version.py")]) or (
        _version_in([setup]) if setup.is_file() else None)
    if found is None:
        return None
    v, where = found
    return Version(v.base_version), f"{where}: this project is {package} {v}"


def _dynamic_version(d: Path) -> Optional[tuple[Version, str]]:
    """The version a build backend reads from a file the pyproject names: setuptools' `[tool.setuptools.dynamic]
    version = { file = "VERSION" }` (axolotl), hatch's `[tool.hatch.version] path` (LLaMA-Factory's
    src/llamafactory/extras/env.py `VERSION = "0.9.4"`)."""
    tool = _toml(d / "pyproject.toml").get("tool", {}) if (d / "pyproject.toml").is_file() else {}
    if not isinstance(tool, dict):
        return None
    dynamic = ((tool.get("setuptools") or {}).get("dynamic") or {}).get("version")
    files = []
    if isinstance(dynamic, dict) and isinstance(dynamic.get("file"), str):
        files.append(dynamic["file"])
    hatch = (tool.get("hatch") or {}).get("version")
    if isinstance(hatch, dict) and isinstance(hatch.get("path"), str):
        files.append(hatch["path"])
    return _version_in([d / f for f in files if ".." not in Path(f).parts]) if files else None


def pin_site(package: str, path: Optional[Path], stop: Optional[Path] = None) -> Optional[tuple[Path, int]]:
    """The file and line of the lock entry or requirement that `resolve` read `package`'s version from
    (the same search, in the same order), or None (explicit, configured, installed, the project's own
    version, unknown)."""
    if path is None:
        return None
    try:
        directory = path.resolve().parent
    except (OSError, RuntimeError):
        return None
    names = ALIASES.get(package, (package,))
    for name in names:
        hit = _declared(directory, name, Path(stop).resolve() if stop else None)
        if hit is None or hit[0] is None:
            continue
        if hit[2] == "checkout":
            return None  # the checkout's own version: no pin to point at
        dirs = project_dirs(directory, Path(stop).resolve() if stop else None)
        if hit[2] == "lock":
            lock = hit[1].split(":", 1)[0]
            for d in dirs:
                row = _line_matching(d / lock, lambda ln: re.search(r'^\s*name\s*=\s*"([^"]+)"', ln), name)
                if row is not None:
                    return d / lock, row
            return None
        where = hit[1].split(":", 1)[0]
        for d in dirs:
            p = d / where
            if where.startswith("requirements") and not p.is_file():
                p = d / "requirements" / where
            row = _line_matching(p, lambda ln: _requirement_in(ln), name)
            if row is not None:
                return p, row
        return None
    return None


def _requirement_in(line: str):
    """A requirement written on a line: the line itself (requirements.txt) or a quoted string (pyproject
    dependencies, setup.py install_requires)."""
    quoted = re.findall(r"""["']([^"'\n]+)["']""", line)
    return quoted or [line]


def _line_matching(p: Path, find, package: str) -> Optional[int]:
    if not p.is_file():
        return None
    for row, line in enumerate(_read(p).splitlines(), 1):
        got = find(line)
        if got is None:
            continue
        if hasattr(got, "group"):
            if _norm(got.group(1)) == package:
                return row
            continue
        if any(_from_requirement_line(x, package) is not None for x in got):
            return row
    return None


@functools.lru_cache(maxsize=512)
def _declared(directory: Path, package: str, stop: Optional[Path] = None) -> Optional[tuple[Optional[Version], str, str]]:
    """(version or None when unbounded below, where, kind "lock"/"declared") for the file's project;
    a project that is the library itself gives its own version."""
    dirs = project_dirs(directory, stop)
    for d in dirs:
        if has_marker(d):
            own = _own_version(d, package)
            if own is not None:
                return own[0], own[1], "checkout"
    for d in dirs:
        for lock in _LOCKS:
            p = d / lock
            if p.is_file():
                v = _lock_version(p, package)
                if v is not None:
                    return v, f"{lock}: {package}=={v}", "lock"
    for d in dirs:
        hit = _declared_in_dir(d, package)
        if hit is not None:
            return hit[0], hit[1], "declared"
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
    stop: Optional[Path] = None,
) -> TargetVersion:
    """The version from the project and the environment; "unknown" when neither says (the caller
    may then ask the code, see `proven`). `stop`: the directory being linted, the highest place a
    requirement file counts when no project root marker sits above the file."""
    if package in explicit:
        v = parse_version(explicit[package])
        if v is not None:
            return TargetVersion(package, v, "--target-version", "explicit")
    if package in config:
        v = parse_version(str(config[package]))
        if v is not None:
            return TargetVersion(package, v, config_source, "config")
    unbounded = None
    names = ALIASES.get(package, (package,))
    if path is not None:
        for name in names:
            hit = _declared(path.resolve().parent, name, Path(stop).resolve() if stop else None)
            if hit is not None:
                v, where, kind = hit
                if v is not None:
                    return TargetVersion(package, v, where, kind)
                unbounded = unbounded or where
    if use_installed:
        v = next((x for x in map(_installed, names) if x is not None), None)
        if v is not None:
            src = "installed" if unbounded is None else f"installed; {unbounded} has no lower bound"
            return TargetVersion(package, Version(f"{v.major}.{v.minor}.{v.micro}"), src, "installed")
    why = (f"{unbounded} has no lower bound" if unbounded else
           "the project declares no requirement on it")
    why += f" and it is not installed" if use_installed else ""
    return TargetVersion(package, Version(DEFAULTS[package]),
                         f"unknown: {why}; assumed the oldest version fsdplint covers", "unknown")


# --- what a known library requires of another -------------------------------------------------
# A library's own requirement bounds another the project leaves undeclared: a job that runs trl 0.11 runs
# transformers >= 4.40, whatever it declares. (requirer, from its release, package, lowest release required),
# highest first; each row read at the release and the one before it (setup.py `REQUIRED_PKGS`):
# trl v0.10.1 "transformers>=4.31.0", v0.11.0 "transformers>=4.40.0", v0.11.4 "transformers>=4.40.0",
# v0.12.0 "transformers>=4.46.0"; v0.8.0 to v0.10.1 "transformers>=4.31.0". peft (v0.10.0 to v0.15.0 read)
# and accelerate require no transformers.
REQUIRES: tuple[tuple[str, str, str, str], ...] = (
    ("trl", "0.12.0", "transformers", "4.46.0"),
    ("trl", "0.11.0", "transformers", "4.40.0"),
    ("trl", "0.8.0", "transformers", "4.31.0"),
)


def admitted_floor(package: str, version_of=None) -> Optional[tuple[Version, str]]:
    """The lowest release of `package` a job may run when it declares none: the highest requirement a known
    version of another library puts on it, with that library's version named ("trl 0.11.0 (requirements.txt:
    trl>=0.11)"); None when nothing known bounds it (any release)."""
    if version_of is None:
        return None
    best: Optional[tuple[Version, str]] = None
    seen: set = set()
    for requirer, since, pkg, needed in REQUIRES:
        if pkg != package or requirer in seen:
            continue
        tv = version_of(requirer)
        if tv is None or not tv.known:
            continue
        if tv.version >= Version(since):
            seen.add(requirer)
            v = Version(needed)
            if best is None or v > best[0]:
                best = v, f"{requirer} {tv.version} ({tv.source})"
    return best


# --- what the code proves ------------------------------------------------------------------
# Imports that only succeed from some release: a module that does them unguarded (no try/except
# ImportError, no version check around them) already needs that release to import at all.
# (module, names (None: the module itself), package, since, citation)
IMPORT_EVIDENCE: tuple[tuple[str, Optional[frozenset], str, str, str], ...] = (
    ("torch.distributed.fsdp", frozenset({
        "fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy",
        "register_fsdp_forward_method", "UnshardHandle",
    }), "torch", "2.6", "torch 2.6 torch/distributed/fsdp/__init__.py makes the FSDP2 API public"),
    ("torch.distributed.fsdp._fully_shard", None, "torch", "2.6",
     "torch 2.6 moves FSDP2 to torch/distributed/fsdp/_fully_shard/"),
    # read at 2.5.1 (absent) and 2.6.0 torch/nn/utils/__init__.py (`_get_total_norm as get_total_norm`)
    ("torch.nn.utils", frozenset({"get_total_norm", "clip_grads_with_norm_"}), "torch", "2.6",
     "torch 2.6 torch/nn/utils/__init__.py makes get_total_norm and clip_grads_with_norm_ public"),
)


@dataclass(frozen=True)
class Evidence:
    package: str
    version: Version
    node: object  # the import or call that proves it
    what: str  # e.g. "from torch.distributed.fsdp import FSDPModule"
    citation: str


def _evidence_for(module: str, name: Optional[str], package: str):
    for mod, names, pkg, since, cite in IMPORT_EVIDENCE:
        if pkg != package:
            continue
        if names is None and (module == mod or module.startswith(mod + ".")):
            return since, cite
        if names is not None and module == mod and name in names:
            return since, cite
    return None


def _unguarded(guards) -> bool:
    return not any(g.kind in ("version", "import_error") for g in guards)


def proven(package: str, collector) -> Optional[Evidence]:
    """The highest release of `package` that the file's unguarded imports (and calls through an
    imported module) need, with the node that needs it; None when nothing is proven."""
    import libcst as cst

    from fsdplint.resolve import dotted

    best: Optional[Evidence] = None

    def consider(since: str, cite: str, node, what: str) -> None:
        nonlocal best
        v = Version(since)
        if best is None or v > best.version:
            best = Evidence(package, v, node, what, cite)

    for node, guards in collector.import_froms:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            continue
        module = dotted(node.module) or ""
        for alias in node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else dotted(alias.name) or ""
            hit = _evidence_for(module, name, package)
            if hit and _unguarded(guards):
                consider(hit[0], hit[1], node, f"from {module} import {name}")
                break
    for call in collector.calls:
        q = call.qualname
        if not q or not isinstance(call.node.func, cst.Attribute):
            continue
        module, _, name = q.rpartition(".")
        hit = _evidence_for(module, name, package)
        if hit and (best is None or Version(hit[0]) > best.version) and _unguarded(call.guards):
            consider(hit[0], hit[1], call.node, q)
    return best
