"""Findings of a file reused across runs while nothing they were drawn from changed (ruff's cache, with
dependencies).

An entry is keyed by the file, the settings, the environment variables fsdplint reads, the interpreter and
fsdplint itself (its version and the stamps of its own sources, so an edited checkout never reuses stale
findings). It holds the findings and what they were drawn from:

- the file's content hash;
- the project modules the analysis could have read: those it did read (`analysis/reads.py`) and every
  module reachable through the import lines of the file and of those modules, each with its content hash;
  so a change to a module invalidates exactly the files that import it, directly or not;
- the listings of the directories those modules lie in (a new module can change what an import resolves to);
- everything else the process opened or listed until the file's lint was over (launchers, YAML and JSON
  configs, `pyproject.toml`, lock and requirements files, installed distributions' metadata), with their
  stamps: read through the audit hook, because several of those reads are memoised for the whole process,
  so a later file's lint uses them without opening anything.

Writes are atomic (a temporary file renamed into place), so concurrent runs never see half an entry, and
an entry that does not load is a miss. The directory is bounded: past `MAX_ENTRIES`, the least recently
written half goes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Optional

import fsdplint
from fsdplint.analysis import reads
from fsdplint.findings import Finding, Position, Related, finding_from_json

FORMAT = 1
MAX_ENTRIES = 20_000
_ENV_PREFIXES = ("FSDP", "ACCELERATE", "HF_", "TRANSFORMERS", "PEFT", "TRL", "TORCH")
_OWN_DIR = os.path.dirname(os.path.abspath(fsdplint.__file__))

# Hits and misses of this process (what a user sees as speed; the tests read them).
STATS = {"hits": 0, "misses": 0}

# Every file opened for reading and directory listed in this process, in order, each once: (kind, path).
_context: list = []
_seen: set = set()
_own_file = [""]  # the file being linted: its content hash is in the entry itself
_skip_dirs: list = []
_module_roots: list = []  # project roots: their .py files are dependencies through `modules`, per file
_hooked = False


def _hook(event: str, args) -> None:
    if event == "open":
        path, mode = args[0], args[1]
        if not isinstance(path, (str, os.PathLike)) or (mode and any(c in str(mode) for c in "wax+")):
            return
        kind = "f"
    elif event in ("os.listdir", "os.scandir"):
        path = args[0] if args else "."
        if not isinstance(path, (str, os.PathLike)):
            return
        kind = "d"
    else:
        return
    p = os.path.abspath(os.fspath(path))
    if p in _seen or p == _own_file[0] or p.endswith(".pyc") or p.startswith(_OWN_DIR):
        return
    if any(p.startswith(d) for d in _skip_dirs):
        return
    if p.endswith(".py") and any(p.startswith(d) for d in _module_roots):
        return
    _seen.add(p)
    _context.append((kind, p))


def install() -> None:
    """Start noting the process's reads (as early as possible: configs read before the first lint count)."""
    global _hooked
    if not _hooked:
        sys.addaudithook(_hook)
        _hooked = True


def _stamp(p: str):
    try:
        st = os.stat(p)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


# Names a listing leaves out: what fsdplint and Python write themselves.
_NOT_LISTED = (".fsdplint_cache", "__pycache__")
# A new file changes findings only when something finds it by listing a directory: a module, a launcher,
# a config next to a script, a requirements or lock file. Other new files (a report written by `-o`, a
# JSON config) matter only once a changed file names them, and that change invalidates by itself.
# Names whose appearance can change a finding: modules, launchers, configs, pins, and the docs launches are
# read from (a README's fenced `accelerate launch ...`).
_LISTED_SUFFIXES = (".py", ".sh", ".bash", ".slurm", ".sbatch", ".yaml", ".yml", ".toml", ".cfg", ".txt",
                    ".lock", ".ini", ".md", ".rst")


def _listed(p: str, name: str) -> bool:
    if name in _NOT_LISTED:
        return False
    return name.endswith(_LISTED_SUFFIXES) or "." not in name or os.path.isdir(os.path.join(p, name))


def _listing(p: str) -> Optional[str]:
    try:
        names = sorted(n for n in os.listdir(p) if _listed(p, n))
    except OSError:
        return None
    return hashlib.sha256("\0".join(names).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _text_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_own_fingerprint: Optional[str] = None


def _own() -> str:
    """fsdplint's version and the stamps of its sources."""
    global _own_fingerprint
    if _own_fingerprint is None:
        h = hashlib.sha256(fsdplint.__version__.encode())
        for dirpath, dirnames, filenames in os.walk(_OWN_DIR):
            dirnames.sort()
            for n in sorted(filenames):
                if n.endswith(".py"):
                    p = os.path.join(dirpath, n)
                    h.update(f"{p}{_stamp(p)}".encode())
        _own_fingerprint = h.hexdigest()
    return _own_fingerprint


def _jsonable(value):
    if is_dataclass(value) and not isinstance(value, type):
        return {type(value).__name__: _jsonable(asdict(value))}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_jsonable(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def _note_json(value):
    # A note may hold another place of the finding (the statement a relocated finding is caused by).
    if isinstance(value, Related):
        return {_RELATED: value.to_json()}
    return value


def _note_back(value):
    if isinstance(value, dict) and set(value) == {_RELATED}:
        r = value[_RELATED]
        return Related(r["filename"], Position(r["location"]["row"], r["location"]["column"]),
                       Position(r["end_location"]["row"], r["end_location"]["column"]), r.get("message", ""))
    return value


_RELATED = "__fsdplint_related__"


def _finding_json(f: Finding) -> dict:
    d = f.to_json()
    d["source_line"] = f.source_line
    d["notes"] = {k: _note_json(v) for k, v in f.notes.items()}
    return d


def _finding_back(d: dict) -> Finding:
    f = finding_from_json(d)
    f.source_line = d.get("source_line", "")
    f.notes = {k: _note_back(v) for k, v in (d.get("notes") or {}).items()}
    return f


class _Validity:
    """What this process already found of each dependency (stamps and listings are checked once)."""

    def __init__(self) -> None:
        self.stamps: dict = {}
        self.hashes: dict = {}
        self.listings: dict = {}
        self.contexts: dict = {}

    def stamp(self, p: str):
        if p not in self.stamps:
            self.stamps[p] = _stamp(p)
        return self.stamps[p]

    def module_hash(self, p: str, stamp) -> Optional[str]:
        key = (p, tuple(stamp) if stamp else None)
        if key not in self.hashes:
            try:
                self.hashes[key] = _text_hash(Path(p).read_bytes())
            except OSError:
                self.hashes[key] = None
        return self.hashes[key]

    def listing(self, p: str):
        if p not in self.listings:
            self.listings[p] = _listing(p)
        return self.listings[p]


_validity = _Validity()


def new_run() -> None:
    """What was found of the dependencies holds for one run: a long-lived process checks them again."""
    global _validity
    _validity = _Validity()


class FileCache:
    """The cache entry of one file under one set of settings."""

    def __init__(self, directory: Path, filename: str, path: Path, project, settings) -> None:
        self.dir = directory
        self.filename = filename
        self.path = path
        self.project = project
        env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}
        # sys.prefix: another environment has other libraries installed (or none), and the installed versions
        # decide findings; a distribution that is absent leaves nothing opened to stamp.
        key = [FORMAT, _own(), sys.version, sys.prefix, os.getcwd(), str(path), filename, _jsonable(settings), env]
        self.key = hashlib.sha256(json.dumps(key, sort_keys=True, default=repr).encode()).hexdigest()
        self.entry_path = directory / "findings" / self.key[:2] / f"{self.key}.json"
        self.data: Optional[bytes] = None
        self.recorded: Optional[set] = None
        self.context_len = 0

    # -- reading ---------------------------------------------------------------------
    def read(self) -> Optional[bytes]:
        _own_file[0] = os.path.abspath(self.filename)
        try:
            self.data = self.path.read_bytes()
        except OSError:
            self.data = None
        return self.data

    def lookup(self) -> Optional[list[Finding]]:
        """The cached findings, when the file and everything they were drawn from are unchanged."""
        if self.data is None:
            return None
        try:
            entry = json.loads(self.entry_path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        try:
            if entry.get("format") != FORMAT or entry["hash"] != _text_hash(self.data):
                return None
            v = _validity
            for p, stamp, digest in entry["modules"]:
                now = v.stamp(p)
                if now != stamp and (now is None) != (stamp is None):
                    return None
                if now != stamp and v.module_hash(p, now) != digest:
                    return None
            for p, listing in entry["dirs"]:
                if v.listing(p) != listing:
                    return None
            if not self._context_valid(entry["context"], entry["context_len"]):
                return None
            return [_finding_back(d) for d in entry["findings"]]
        except (KeyError, TypeError, ValueError):
            return None

    def _context_valid(self, name: str, n: int) -> bool:
        key = (name, n)
        hit = _validity.contexts.get(key)
        if hit is None:
            hit = False
            try:
                items = json.loads((self.dir / "context" / name[:2] / f"{name}.json").read_text(encoding="utf-8"))
                hit = len(items) >= n and all(
                    (_validity.stamp(p) if kind == "f" else _validity.listing(p)) == sig
                    for kind, p, sig in items[:n])
            except (OSError, ValueError, TypeError):
                hit = False
            _validity.contexts[key] = hit
        return hit

    # -- writing ---------------------------------------------------------------------
    def record(self) -> None:
        self.recorded = reads.start()

    def store(self, findings: list[Finding]) -> None:
        recorded, self.recorded = self.recorded, None
        reads.stop()
        _own_file[0] = ""
        if self.data is None or recorded is None:
            return
        try:
            payload = [_finding_json(f) for f in findings]
            modules = self._modules(recorded)
            dirs = sorted({os.path.dirname(p) for p, _, _ in modules} | {str(self.path.parent)})
            context, context_len = _write_context(self.dir)
            entry = {
                "format": FORMAT,
                "hash": _text_hash(self.data),
                "modules": modules,
                "dirs": [[d, _validity.listing(d)] for d in dirs],
                "context": context,
                "context_len": context_len,
                "findings": payload,
            }
            text = json.dumps(entry, separators=(",", ":"))
        except (TypeError, ValueError, OSError, RecursionError):
            return  # something not serialisable: this file is linted again next time
        _atomic_write(self.entry_path, text)
        _bound(self.dir / "findings")

    def _modules(self, recorded: set) -> list:
        """Each project module the findings may depend on, with its stamp and content hash."""
        proj = self.project
        own = self.path.resolve()
        todo = [own, *recorded]
        seen: set = set()
        out = []
        while todo:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            text = proj.text(p)
            hit = _edges.get(p)
            if hit is None or hit[0] is not text:
                hit = _edges[p] = (text, _digest(text), _imported(proj, p, text))
            if p != own:
                out.append([str(p), _validity.stamp(str(p)), hit[1]])
            todo.extend(hit[2])
        return sorted(out)


# Per module, while its text is the same object (the index hands out one per unchanged file): its content
# hash and the project modules its import lines name (every importer's closure walks them again).
_edges: dict = {}


def _digest(text: Optional[str]) -> Optional[str]:
    return _text_hash(text.encode("utf-8", "surrogatepass")) if text is not None else None


def _imported(proj, p: Path, text: Optional[str]) -> list:
    from fsdplint.analysis.index import quick_imports

    if not text or "import" not in text:
        return []
    imports = quick_imports(text)
    sheet = proj._by_path.get(p)
    if sheet is not None:
        imports = imports + list(sheet[1].get("imports", ()))
    out = []
    for local, module, attr, level in imports:
        try:
            found = proj.find_module(p, module, level)
            if found is not None and attr is not None and found.name == "__init__.py":
                sub = proj._module_file(found.parent, [attr])  # `from pkg import module`
                if sub is not None:
                    out.append(sub)
            elif found is None and attr is not None:
                ns = proj._namespace_dir(p, module, level)
                sub = proj._module_file(ns, [attr]) if ns is not None else None
                if sub is not None:
                    out.append(sub)
        except (OSError, ValueError, RecursionError):
            continue
        if found is not None:
            out.append(found)
    return out


_written_context: dict = {}
_context_items: list = []
_context_done = [0]


def _write_context(directory: Path) -> tuple:
    """The process's reads so far, as a shared file named by its content: (its name, how many entries)."""
    n = len(_context)
    if n in _written_context:
        return _written_context[n]
    items = _context_items
    for kind, p in _context[_context_done[0]:]:  # only what was read since the last snapshot
        if kind == "f" and p.endswith(".py") and any(p.startswith(d) for d in _module_roots):
            continue  # read before its project was known (the run's lint order): a module, not context
        items.append([kind, p, _validity.stamp(p) if kind == "f" else _validity.listing(p)])
    _context_done[0] = n
    text = json.dumps(items, separators=(",", ":"))
    name = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    path = directory / "context" / name[:2] / f"{name}.json"
    if not path.exists():
        _atomic_write(path, text)
    _written_context.clear()
    _written_context[n] = (name, len(items))
    return name, len(items)


def _atomic_write(path: Path, text: str) -> None:
    from fsdplint.analysis.cache import atomic_write_text

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    except OSError:
        pass  # a read-only tree: lint on without the cache


_bounded: set = set()


def _bound(directory: Path) -> None:
    """Once per process and directory: past MAX_ENTRIES entries, drop the least recently written half."""
    if directory in _bounded:
        return
    _bounded.add(directory)
    try:
        entries = [e for sub in os.scandir(directory) if sub.is_dir() for e in os.scandir(sub.path)]
    except OSError:
        return
    if len(entries) <= MAX_ENTRIES:
        return
    entries.sort(key=lambda e: e.stat().st_mtime_ns if e.is_file() else 0)
    for e in entries[: len(entries) - MAX_ENTRIES // 2]:
        try:
            os.unlink(e.path)
        except OSError:
            pass


def for_file(filename: str, settings, project) -> Optional[FileCache]:
    """The cache of this file's findings, or None where findings are not cached (fixes, stdin, no project)."""
    if not settings.use_cache or settings.fix or project is None or project.cache is None:
        return None
    directory = project.cache.dir.parent  # <cache dir>/<version>/
    d = os.path.abspath(str(directory))
    if d not in _skip_dirs:
        _skip_dirs.append(d)
    root = os.path.join(os.path.abspath(str(project.root)), "")
    if root not in _module_roots:
        _module_roots.append(root)
    try:
        path = Path(filename).resolve()
    except (OSError, RuntimeError):
        return None
    return FileCache(directory, filename, path, project, settings)
