"""Project configuration: `[tool.fsdplint]` in pyproject.toml, or `fsdplint.toml`.

`fsdplint.toml` (and `.fsdplint.toml`) hold the same keys at top level, like
`ruff.toml`. The nearest configuration file above each linted file wins; a
`pyproject.toml` without a `[tool.fsdplint]` table is skipped. CLI flags are
merged on top by the CLI (see `Config.selected_codes`).

Keys (all optional)::

    [tool.fsdplint]
    select = ["FSDP"]                 # codes or prefixes; default: every rule
    extend-select = ["FSDP9"]
    ignore = ["FSDP015"]
    per-file-ignores = { "tests/*" = ["FSDP103"] }
    exclude = [".venv", "build"]      # replaces the default exclusions
    extend-exclude = ["legacy/*.py"]  # adds to them
    fixable = ["ALL"]
    unfixable = ["FSDP007"]
    target-version = { torch = "2.6", peft = "0.13" }
    strict-versions = true            # version-dependent findings stay errors when the version is unknown

    [tool.fsdplint.rules.FSDP003]     # per-rule options (code or rule name)
    max-unit-params = 1_000_000_000

Globs without a `/` match any path component (`.venv`, `*_test.py`); globs
with a `/` match the path relative to the configuration file's directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Optional

from fsdplint.errors import UsageError
from fsdplint.toml_io import read_toml as _read_toml

CONFIG_FILENAMES = ("fsdplint.toml", ".fsdplint.toml", "pyproject.toml")

DEFAULT_EXCLUDE = (
    ".bzr", ".direnv", ".eggs", ".git", ".git-rewrite", ".hg", ".ipynb_checkpoints", ".mypy_cache",
    ".nox", ".pants.d", ".pyenv", ".pytest_cache", ".pytype", ".ruff_cache", ".svn", ".tox", ".venv",
    ".vscode", "__pypackages__", "_build", "buck-out", "build", "dist", "node_modules", "site-packages",
    "venv",
)

_LIST_KEYS = ("select", "ignore", "extend-select", "exclude", "extend-exclude", "fixable", "unfixable")
KNOWN_KEYS = frozenset(_LIST_KEYS + ("per-file-ignores", "target-version", "strict-versions", "rules"))


@dataclass
class Config:
    select: Optional[list[str]] = None
    ignore: list[str] = field(default_factory=list)
    extend_select: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    exclude: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDE))
    extend_exclude: list[str] = field(default_factory=list)
    fixable: Optional[list[str]] = None
    unfixable: list[str] = field(default_factory=list)
    # Target library versions, e.g. {"torch": "2.6"}.
    target_version: dict[str, str] = field(default_factory=dict)
    # When the target version is unknown (not declared, pinned or installed), a version-dependent
    # finding is a warning; True keeps it an error.
    strict_versions: bool = False
    # Per-rule options keyed by rule code, option names as written (kebab-case). A rule
    # that declares `OPTIONS` (a collection of option names) gets unknown ones warned about.
    rules: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The file this configuration came from; None for the defaults.
    source: Optional[Path] = None
    # Problems worth telling the user about that do not stop the run.
    warnings: list[str] = field(default_factory=list)

    @property
    def root(self) -> Optional[Path]:
        """The directory relative globs are resolved against."""
        return self.source.parent if self.source else None

    def selected_codes(self, select=None, ignore=None, extend_select=None, *, known=None) -> set[str]:
        """Rule codes to run: every rule, then this file, then CLI flags (later layers win).

        Within a layer `select` replaces what came before (when given), then
        `extend-select` adds and `ignore` removes.
        """
        if known is None:
            from fsdplint.registry import all_rules

            known = [r.code for r in all_rules()]
        codes = list(known)
        chosen = set(codes)
        for sel, ext, ign in ((self.select, self.extend_select, self.ignore), (select, extend_select, ignore)):
            if sel:
                chosen = _expand(sel, codes)
            chosen |= _expand(ext, codes)
            chosen -= _expand(ign, codes)
        return chosen

    def is_excluded(self, path: Path) -> bool:
        parts = _rel_parts(path, self.root)  # once per path, not once per pattern (discovery walks every file)
        return any(_glob_matches(p, path, self.root, parts) for p in (*self.exclude, *self.extend_exclude))

    def ignored_for(self, path: Path) -> set[str]:
        """Codes/prefixes that `per-file-ignores` switches off for `path`."""
        out: set[str] = set()
        parts = _rel_parts(path, self.root) if self.per_file_ignores else ()
        for pattern, codes in self.per_file_ignores.items():
            if _glob_matches(pattern, path, self.root, parts):
                out.update(c.upper() for c in codes)
        return out

    def is_code_ignored_for(self, code: str, path: Path) -> bool:
        return any(_code_matches(code, sel) for sel in self.ignored_for(path))

    def is_fixable(self, code: str) -> bool:
        allowed = self.fixable is None or any(_code_matches(code, s) for s in self.fixable)
        return allowed and not any(_code_matches(code, s) for s in self.unfixable)

    def rule_options(self, code: str) -> dict[str, Any]:
        return dict(self.rules.get(code.upper(), {}))


def _expand(selectors, codes) -> set[str]:
    return {c for c in codes for s in selectors or () if s.strip() and _code_matches(c, s)}


def _code_matches(code: str, selector: str) -> bool:
    sel = selector.strip().upper()
    return sel == "ALL" or code.upper().startswith(sel)


# --- globs ---------------------------------------------------------------

@lru_cache(maxsize=1024)
def _glob_to_regex(pattern: str) -> re.Pattern:
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def _rel_parts(path: Path, root: Optional[Path]) -> tuple:
    """The parts of `path` that patterns match: relative to `root` (else to the working directory); just
    the name for a path outside it."""
    path = Path(path).absolute()
    if root is not None:
        try:
            return path.relative_to(Path(root).absolute()).parts
        except ValueError:
            return path.parts[-1:]
    cwd = Path.cwd()
    return path.relative_to(cwd).parts if path.is_relative_to(cwd) else path.parts[-1:]


def _glob_matches(pattern: str, path: Path, root: Optional[Path], rel_parts: Optional[tuple] = None) -> bool:
    pattern = pattern.replace("\\", "/").rstrip("/")
    if rel_parts is None:
        rel_parts = _rel_parts(path, root)
    if not pattern:
        return False
    rx = _glob_to_regex(pattern.removeprefix("./"))
    if "/" not in pattern:
        return any(rx.match(part) for part in rel_parts)
    rel = "/".join(rel_parts)
    # A directory pattern also matches everything below it.
    return bool(rx.match(rel)) or any(rx.match("/".join(rel_parts[:k])) for k in range(1, len(rel_parts)))


# --- loading -------------------------------------------------------------

_cache: dict[Path, Optional[Path]] = {}
_parsed: dict[Path, Config] = {}


def clear_cache() -> None:
    _cache.clear()
    _parsed.clear()


def find_config_file(start: Path) -> Optional[Path]:
    """The nearest configuration file in `start` (a file or directory) or above it."""
    start = Path(start).absolute()
    directory = start if start.is_dir() else start.parent
    visited = []
    found: Optional[Path] = None
    for d in (directory, *directory.parents):
        if d in _cache:
            found = _cache[d]
            break
        visited.append(d)
        found = _config_in(d)
        if found is not None:
            break
    for d in visited:
        _cache[d] = found
    return found


def _config_in(directory: Path) -> Optional[Path]:
    for name in CONFIG_FILENAMES:
        candidate = directory / name
        if not candidate.is_file():
            continue
        if name != "pyproject.toml":
            return candidate
        try:
            data = _read_toml(candidate)
        except UsageError:
            return candidate  # report the syntax error when it is loaded
        if isinstance(data.get("tool"), dict) and "fsdplint" in data["tool"]:
            return candidate
    return None


def load_config(path: Path, *, explicit: Optional[Path] = None, isolated: bool = False) -> Config:
    """The configuration that applies to `path` (a linted file or directory).

    `explicit` (the `--config` flag) is used for every file; `isolated` ignores
    all configuration files.
    """
    if isolated:
        return Config()
    if explicit is not None:
        explicit = Path(explicit)
        if not explicit.is_file():
            raise UsageError(f"{explicit}: configuration file not found")
        source = explicit.absolute()
    else:
        source = find_config_file(path)
        if source is None:
            return Config()
    if source not in _parsed:
        _parsed[source] = parse_config_file(source)
    return _parsed[source]


def parse_config_file(path: Path) -> Config:
    path = Path(path).absolute()
    data = _read_toml(path)
    if path.name == "pyproject.toml":
        table = data.get("tool", {}).get("fsdplint", {}) if isinstance(data.get("tool"), dict) else {}
        where = "[tool.fsdplint]"
    else:
        table, where = data, "top level"
    if not isinstance(table, dict):
        raise UsageError(f"{path}: [tool.fsdplint] must be a table")
    return config_from_table(table, path, where)


def config_from_table(table: dict, path: Path, where: str = "[tool.fsdplint]") -> Config:
    cfg = Config(source=path)

    def fail(key: str, expected: str):
        raise UsageError(f"{path}: `{key}` in {where} must be {expected}, got {table[key]!r}")

    def str_list(key: str) -> list[str]:
        value = table[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            fail(key, "a list of strings")
        return list(value)

    for key in table:
        if key not in KNOWN_KEYS:
            hint = _suggest(key, KNOWN_KEYS)
            cfg.warnings.append(f"{path}: unknown key `{key}` in {where}" + (f" (did you mean `{hint}`?)" if hint else ""))
    if "select" in table:
        cfg.select = str_list("select")
    if "ignore" in table:
        cfg.ignore = str_list("ignore")
    if "extend-select" in table:
        cfg.extend_select = str_list("extend-select")
    if "exclude" in table:
        cfg.exclude = str_list("exclude")
    if "extend-exclude" in table:
        cfg.extend_exclude = str_list("extend-exclude")
    if "fixable" in table:
        cfg.fixable = str_list("fixable")
    if "unfixable" in table:
        cfg.unfixable = str_list("unfixable")
    if "per-file-ignores" in table:
        pfi = table["per-file-ignores"]
        if not isinstance(pfi, dict) or not all(
            isinstance(v, list) and all(isinstance(c, str) for c in v) for v in pfi.values()
        ):
            fail("per-file-ignores", 'a table of glob = ["CODE", ...]')
        cfg.per_file_ignores = {k: list(v) for k, v in pfi.items()}
    if "target-version" in table:
        tv = table["target-version"]
        if not isinstance(tv, dict) or not all(isinstance(v, str) for v in tv.values()):
            fail("target-version", 'a table like { torch = "2.6", peft = "0.13" }')
        from fsdplint.versions import PACKAGES, parse_version

        for dist, version in tv.items():
            if dist not in PACKAGES:
                cfg.warnings.append(
                    f"{path}: unknown distribution `{dist}` in target-version (known: {', '.join(PACKAGES)})"
                )
            if parse_version(version.strip()) is None:
                raise UsageError(f"{path}: target-version.{dist} = {version!r} is not a version like \"2.6\"")
        cfg.target_version = {k: v.strip() for k, v in tv.items()}
    if "strict-versions" in table:
        if not isinstance(table["strict-versions"], bool):
            fail("strict-versions", "true or false")
        cfg.strict_versions = table["strict-versions"]
    if "rules" in table:
        cfg.rules = _rule_options(table["rules"], path, cfg.warnings)
    _check_selectors(cfg, path)
    return cfg


def _rule_options(rules: Any, path: Path, warnings: list[str]) -> dict[str, dict[str, Any]]:
    from fsdplint.registry import get_rule

    if not isinstance(rules, dict) or not all(isinstance(v, dict) for v in rules.values()):
        raise UsageError(f"{path}: `rules` must be a table of per-rule tables, e.g. [tool.fsdplint.rules.FSDP003]")
    out: dict[str, dict[str, Any]] = {}
    for key, options in rules.items():
        rule = get_rule(key)
        if rule is None:
            warnings.append(f"{path}: unknown rule `{key}` in rules")
            out[key.upper()] = dict(options)
            continue
        known = getattr(rule, "OPTIONS", None)
        if known is not None:
            for opt in options:
                if opt not in known:
                    warnings.append(f"{path}: unknown option `{opt}` for rule {rule.code} ({rule.name})")
        out.setdefault(rule.code, {}).update(options)
    return out


def _check_selectors(cfg: Config, path: Path) -> None:
    from fsdplint.registry import unknown_selectors

    lists = {
        "select": cfg.select or [],
        "ignore": cfg.ignore,
        "extend-select": cfg.extend_select,
        "fixable": cfg.fixable or [],
        "unfixable": cfg.unfixable,
    }
    for pattern, codes in cfg.per_file_ignores.items():
        lists[f"per-file-ignores.{pattern!r}"] = codes
    for key, selectors in lists.items():
        for bad in unknown_selectors(selectors):
            cfg.warnings.append(f"{path}: unknown rule selector `{bad}` in {key}")


def _suggest(key: str, known: Iterable[str]) -> Optional[str]:
    import difflib

    match = difflib.get_close_matches(key.replace("_", "-"), sorted(known), n=1, cutoff=0.6)
    return match[0] if match else None
