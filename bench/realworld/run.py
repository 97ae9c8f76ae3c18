"""Score fsdplint on real bugs: lint each case's bug tree as a user would, count what it catches.

    python bench/realworld/run.py [--repos DIR] [--only ID,...] [--json out.json]
                                  [--output results.md] [--fsdplint CMD] [--bench DIR]

Cases are `cases/<id>/case.toml` (+ `bug/`, optional `fixed/`) and `[[case]]` entries of every
`manifest*.toml` (a public repository at the commit before a fix, extracted from a local bare clone
found in `--repos DIR/owner+name`). Each tree is copied to a fresh temporary directory and linted
there with the `fsdplint` command line (never imported), so nothing around the benchmark — this
repository's own pyproject.toml or config — leaks into the verdict. A case that carries the setup its
report states (`reported_*` fields: the launch line, the launch files, the library versions) is scored
twice: as the tree stood without them, and with them; both recalls are printed. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        tomllib = None  # type: ignore[assignment]

HERE = Path(__file__).resolve().parent
FIELDS = ("id", "title", "source", "expect", "covered", "shape", "setup", "notes")
MANIFEST_FIELDS = ("repo", "bug_commit", "paths")
# The setup the report states, when the tree alone does not carry it (README "The reported setup").
REPORTED_FIELDS = ("reported_launch", "reported_files", "reported_paths", "reported_overlay", "reported_patch",
                   "reported_versions")
LINT_TIMEOUT_S = 600


def _absolute_pythonpath() -> dict:
    """The environment with PYTHONPATH's entries made absolute: the lint runs inside the copied tree, where
    `PYTHONPATH=.` would name the tree, not the checkout whose fsdplint is measured (which then silently
    falls back to whatever fsdplint is installed)."""
    env = dict(os.environ)
    entries = env.get("PYTHONPATH")
    if entries:
        env["PYTHONPATH"] = os.pathsep.join(str(Path(e).resolve()) if e else e for e in entries.split(os.pathsep))
    return env


class BenchError(Exception):
    """A malformed case or manifest: reported in one line, exit 2."""


# --- loading cases -------------------------------------------------------------------------------

def _read_toml(path: Path) -> dict:
    if tomllib is None:
        raise BenchError("reading TOML needs Python >= 3.11 (tomllib) or the tomli package")
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise BenchError(f"{path}: {exc}") from None


def _check_fields(case: dict, where: str, extra=()) -> None:
    missing = [f for f in FIELDS + tuple(extra) if f not in case]
    if missing:
        raise BenchError(f"{where}: missing field(s) {', '.join(missing)}")


def _is_relative(p) -> bool:
    return isinstance(p, str) and p.strip() != "" and not p.startswith("/") and ".." not in Path(p).parts


def _check_reported(case: dict, where: str, base: Path) -> None:
    """The `reported_*` fields: their types, and that the files they name exist."""
    handwritten = case["kind"] == "handwritten"
    for field in ("reported_paths", "reported_overlay", "reported_patch") if handwritten else ("reported_files",):
        if field in case:
            raise BenchError(f"{where}: {field} is for {'manifest' if handwritten else 'handwritten'} cases")
    for field in ("reported_launch", "reported_files", "reported_paths"):
        value = case.get(field)
        if value is None:
            continue
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
            raise BenchError(f"{where}: {field} must be a non-empty list of strings")
        if field != "reported_launch" and not all(_is_relative(v) for v in value):
            raise BenchError(f"{where}: {field} must hold relative paths without '..'")
    versions = case.get("reported_versions")
    if versions is not None and (not isinstance(versions, dict) or not versions
                                 or not all(isinstance(v, str) and v.strip() for v in versions.values())):
        raise BenchError(f"{where}: reported_versions must be a table of package = \"version\"")
    for name in case.get("reported_files", []):
        for tree in ("bug", "fixed"):
            if (base / tree).is_dir() and not (base / tree / name).is_file():
                raise BenchError(f"{where}: reported_files names {name}, which {tree}/ does not hold")
    overlay = case.get("reported_overlay")
    if overlay is not None:
        if not _is_relative(overlay) or not (base / overlay).is_dir():
            raise BenchError(f"{where}: reported_overlay {overlay!r} is not a folder next to the manifest")
        case["overlay_dir"] = str(base / overlay)
    patch = case.get("reported_patch")
    if patch is not None:
        if not _is_relative(patch) or not (base / patch).is_file():
            raise BenchError(f"{where}: reported_patch {patch!r} is not a file next to the manifest")
        case["patch_file"] = str(base / patch)
    case["reported"] = [f.split("_", 1)[1] for f in REPORTED_FIELDS if f in case]


def load_cases(bench: Path) -> list[dict]:
    """Every case of the benchmark, handwritten and manifest, in a stable order."""
    cases = []
    cases_dir = bench / "cases"
    if cases_dir.is_dir():
        for case_toml in sorted(cases_dir.glob("*/case.toml")):
            case = _read_toml(case_toml)
            _check_fields(case, str(case_toml))
            case["kind"] = "handwritten"
            case["dir"] = str(case_toml.parent)
            if not (case_toml.parent / "bug").is_dir():
                raise BenchError(f"{case_toml}: no bug/ directory next to it")
            _check_reported(case, str(case_toml), case_toml.parent)
            cases.append(case)
    for manifest in sorted(bench.glob("manifest*.toml")):
        data = _read_toml(manifest)
        for i, case in enumerate(data.get("case", [])):
            where = f"{manifest} [[case]] #{i + 1} ({case.get('id', '?')})"
            _check_fields(case, where, MANIFEST_FIELDS)
            case["kind"] = "manifest"
            case["manifest"] = manifest.name
            _check_reported(case, where, manifest.parent)
            cases.append(case)
    seen = set()
    for case in cases:
        if case["id"] in seen:
            raise BenchError(f"duplicate case id {case['id']!r}")
        seen.add(case["id"])
    return cases


# --- the fsdplint command line -------------------------------------------------------------------

def default_command() -> list[str]:
    exe = shutil.which("fsdplint")
    if exe:
        return [exe]
    # The console script may not be on PATH (a virtual environment that is not activated).
    beside = Path(sys.executable).with_name("fsdplint")
    if beside.exists():
        return [str(beside)]
    return [sys.executable, "-m", "fsdplint"]


class Linter:
    """Runs the CLI; probes its help once so that options it lacks are simply not passed."""

    def __init__(self, command: list[str]):
        self.command = command
        self.prefix: list[str] = []
        help_text = ""
        for probe in (["check", "--help"], ["--help"]):
            try:
                proc = subprocess.run(command + probe, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise BenchError(f"cannot run {shlex.join(command)}: {exc}") from None
            if proc.returncode == 0 and "--output-format" in proc.stdout:
                help_text = proc.stdout
                if probe[0] == "check":
                    self.prefix = ["check"]
                break
        if not help_text:
            raise BenchError(f"{shlex.join(command)} has no --output-format option (is it fsdplint?)")
        self.options = ["--output-format", "json"]
        if "--no-cache" in help_text:
            self.options.append("--no-cache")
        self.has_exit_zero = "--exit-zero" in help_text
        self.has_launch = "--launch" in help_text
        self.has_target_version = "--target-version" in help_text

    def version(self) -> str:
        try:
            proc = subprocess.run(self.command + ["--version"], capture_output=True, text=True, timeout=60)
            return proc.stdout.strip() or proc.stderr.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"

    def setup_args(self, case: dict) -> list[str] | str:
        """The options that give the reported launch and versions (or a line saying why this CLI cannot)."""
        args: list[str] = []
        for cmd in case.get("reported_launch", []):
            if not self.has_launch:
                return "this fsdplint has no --launch option for the reported launch"
            args += ["--launch", cmd]
        for package, version in sorted(case.get("reported_versions", {}).items()):
            if not self.has_target_version:
                return "this fsdplint has no --target-version option for the reported versions"
            args += ["--target-version", f"{package}={version}"]
        return args

    def lint(self, tree: Path, extra: list[str] = ()) -> dict:
        """Lint a whole tree from its root; returns {'findings': [...]} or {'error': '...'}."""
        argv = self.command + self.prefix + ["."] + self.options + list(extra)
        start = time.monotonic()
        try:
            proc = subprocess.run(argv, cwd=tree, capture_output=True, text=True, timeout=LINT_TIMEOUT_S,
                                  env=_absolute_pythonpath())
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {LINT_TIMEOUT_S} s", "seconds": LINT_TIMEOUT_S}
        seconds = round(time.monotonic() - start, 2)
        if proc.returncode not in (0, 1):
            first = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[0]
            return {"error": f"exit {proc.returncode}: {first}", "seconds": seconds}
        try:
            findings = json.loads(proc.stdout or "[]")
        except json.JSONDecodeError:
            return {"error": "the JSON report could not be parsed", "seconds": seconds}
        if isinstance(findings, dict):  # a report object rather than a bare list
            findings = findings.get("findings", [])
        return {"findings": findings, "seconds": seconds}


# --- trees ---------------------------------------------------------------------------------------

def find_git_dir(repos: Path, repo: str) -> Path | None:
    """The bare clone of owner/name under `repos` (`owner+name`, or a .git / repo folder inside it)."""
    base = repos / repo.replace("/", "+")
    for cand in (base, base / ".git", base / "repo", base / "repo" / ".git"):
        if (cand / "HEAD").is_file() and (cand / "objects").is_dir():
            return cand
    return None


def extract(git_dir: Path, commit: str, paths: list[str], into: Path) -> str | None:
    """Write the files of COMMIT under PATHS into `into`; returns an error line or None.

    Equivalent to `git archive COMMIT PATHS | tar -x`, but reads blobs one by one
    (`git ls-tree` + `git cat-file --batch`) so that a snapshot whose large files are absent
    still yields every file it has.
    """
    into.mkdir(parents=True, exist_ok=True)
    ls = subprocess.run(
        ["git", "--git-dir", str(git_dir), "ls-tree", "-r", "-z", commit, "--", *paths],
        capture_output=True,
    )
    if ls.returncode != 0:
        err = ls.stderr.decode(errors="replace").strip().splitlines()
        return f"git ls-tree {commit[:12]} failed: {err[0] if err else 'no output'}"
    entries = []
    for record in ls.stdout.decode("utf-8", errors="surrogateescape").split("\0"):
        if not record:
            continue
        meta, _, name = record.partition("\t")
        mode, kind, sha = meta.split()
        if kind == "blob" and mode != "120000":  # skip symlinks and submodules
            entries.append((name, sha))
    if not entries:
        return f"no files under {paths or ['.']} at {commit[:12]}"
    batch = subprocess.Popen(
        ["git", "--git-dir", str(git_dir), "cat-file", "--batch"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    try:
        for name, sha in entries:
            batch.stdin.write(sha.encode() + b"\n")
            batch.stdin.flush()
            header = batch.stdout.readline().split()
            if len(header) < 3 or header[1] == b"missing":
                continue  # an object the snapshot does not hold (large files)
            size = int(header[2])
            data = batch.stdout.read(size)
            batch.stdout.read(1)  # the newline after the contents
            target = into / name
            if ".." in Path(name).parts:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    finally:
        batch.stdin.close()
        batch.wait()
    return None


def summarize(findings: list[dict]) -> list[str]:
    """Sorted `CODE:severity` strings, one per distinct pair."""
    return sorted({f"{f.get('code')}:{f.get('severity')}" for f in findings})


def _overlay(src: Path, tree: Path) -> str | None:
    """Copy the files of a `reported_overlay` folder into an extracted tree; never over a file of the tree."""
    for f in sorted(src.rglob("*")):
        if not f.is_file():
            continue
        target = tree / f.relative_to(src)
        if target.exists():
            return f"reported_overlay {f.relative_to(src)} would replace a file of the repository"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
    return None


def _apply_patch(patch: Path, tree: Path) -> str | None:
    """Apply a `reported_patch` (a diff holding only the reporter's edits of repository files) to an extracted tree."""
    proc = subprocess.run(["git", "apply", "-p1", "--whitespace=nowarn", str(patch)], cwd=tree,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return f"reported_patch does not apply: {lines[0] if lines else 'git apply failed'}"
    return None


def _write_trees(case: dict, repos: Path | None, work: Path, reported: bool) -> dict:
    """The bug tree (and fixed tree, if any) of one pass: {'bug', 'fixed'} paths, or 'skipped'/'error'."""
    bug, fixed = work / "bug", work / "fixed"
    out: dict = {"bug": bug, "fixed": None}
    if case["kind"] == "handwritten":
        drop = [] if reported else list(case.get("reported_files", []))
        for name in ("bug", "fixed"):
            src = Path(case["dir"]) / name
            if not src.is_dir():
                continue
            shutil.copytree(src, work / name)
            for rel in drop:  # as the tree stood before the reported setup was added to it
                (work / name / rel).unlink(missing_ok=True)
            out[name] = work / name
        return out
    git_dir = find_git_dir(repos, case["repo"]) if repos else None
    if git_dir is None:
        return {"skipped": "no local copy" + ("" if repos else " (no --repos given)")}
    paths = list(case["paths"])
    if reported and case.get("reported_paths") and paths:  # `paths = []` is already the whole tree
        paths += case["reported_paths"]
    err = extract(git_dir, case["bug_commit"], paths, bug)
    if err is None and reported and case.get("overlay_dir"):
        err = _overlay(Path(case["overlay_dir"]), bug)
    if err is None and reported and case.get("patch_file"):
        err = _apply_patch(Path(case["patch_file"]), bug)
    if err:
        return {"error": err}
    if case.get("fix_commit"):
        err = extract(git_dir, case["fix_commit"], paths, fixed)
        if err is None and reported and case.get("overlay_dir"):
            err = _overlay(Path(case["overlay_dir"]), fixed)
        if err is None and reported and case.get("patch_file"):
            err = _apply_patch(Path(case["patch_file"]), fixed)
        if err:
            out["fixed_error"] = err
        else:
            out["fixed"] = fixed
    return out


def _where(f: dict) -> str:
    return f"{f.get('filename')}:{(f.get('location') or {}).get('row')} {f.get('code')}"


def _score_pass(case: dict, linter: Linter, repos: Path | None, work: Path, reported: bool) -> dict:
    """Lint one pass (as the tree stood, or with the reported setup) and score it."""
    expect = set(case["expect"])
    trees = _write_trees(case, repos, work, reported)
    if "skipped" in trees:
        return {"status": "skipped", "reason": trees["skipped"]}
    if "error" in trees:
        return {"status": "error", "reason": trees["error"]}
    extra = linter.setup_args(case) if reported else []
    if isinstance(extra, str):
        return {"status": "error", "reason": extra}
    out: dict = {}
    if "fixed_error" in trees:
        out["fixed_error"] = trees["fixed_error"]
    result = linter.lint(trees["bug"], extra)
    out["seconds"] = result.get("seconds")
    if "error" in result:
        out["status"], out["reason"] = "error", result["error"]
        return out
    findings = result["findings"]
    out["found"] = summarize(findings)
    hits = [f for f in findings if f.get("code") in expect and f.get("severity") in ("error", "warning")]
    if hits:
        out["status"] = "caught"
    else:
        out["status"] = "missed" if case["covered"] else "uncovered"
    out["hits"] = sorted({_where(f) for f in hits})
    if trees["fixed"] is not None:
        fres = linter.lint(trees["fixed"], extra)
        if "error" in fres:
            out["fixed_error"] = fres["error"]
        else:
            reviewed = set(case.get("fixed_true_findings", []))
            errors = [f for f in fres["findings"] if f.get("severity") == "error"]
            out["false_alarms"] = sorted(_where(f) for f in errors if f.get("code") not in reviewed)
            out["fixed_true_findings"] = sorted(_where(f) for f in errors if f.get("code") in reviewed)
    return out


def score_case(case: dict, linter: Linter, repos: Path | None, work: Path) -> dict:
    """Score a case; one carrying a reported setup is scored with it, and again as its tree stood."""
    row = {
        "id": case["id"], "kind": case["kind"], "setup": case["setup"], "shape": list(case["shape"]),
        "covered": bool(case["covered"]), "expect": sorted(case["expect"]), "source": list(case["source"]),
    }
    reported = list(case.get("reported", []))
    row["reported_setup"] = reported
    row.update(_score_pass(case, linter, repos, work / case["id"] / "reported", reported=True))
    if reported and row["status"] != "skipped":
        stood = _score_pass(case, linter, repos, work / case["id"] / "as-stood", reported=False)
        row["as_stood"] = {k: stood[k] for k in ("status", "reason", "found", "false_alarms") if k in stood}
    return row


# --- report --------------------------------------------------------------------------------------

def _pct(num: int, den: int) -> str:
    return f"{num}/{den} ({100.0 * num / den:.0f}%)" if den else "0/0 (-)"


_RAN = ("caught", "missed", "uncovered")


def _recall_by(covered: list[dict], status) -> dict:
    """caught / cases per setup and per kind, `status(row)` giving the pass's result."""
    out = {}
    for field in ("setup", "kind"):
        out[field] = {}
        for value in sorted({r[field] for r in covered}):
            sub = [r for r in covered if r[field] == value]
            out[field][value] = {"caught": sum(status(r) == "caught" for r in sub), "cases": len(sub)}
    return out


def _stood(row: dict) -> dict:
    """The row as its tree stood (the same row when the case carries no reported setup)."""
    return row.get("as_stood", row)


def totals(rows: list[dict]) -> dict:
    ran = [r for r in rows if r["status"] in _RAN]
    covered = [r for r in ran if r["covered"]]
    split = _recall_by(covered, lambda r: r["status"])
    by_setup, by_kind = split["setup"], split["kind"]
    stood_covered = [r for r in rows if r["covered"] and _stood(r)["status"] in _RAN]
    stood_split = _recall_by(stood_covered, lambda r: _stood(r)["status"])
    stood_alarms = [(r["id"], a) for r in rows for a in _stood(r).get("false_alarms", [])]
    by_shape = {}
    for shape in sorted({s for r in covered for s in r["shape"]}):
        sub = [r for r in covered if shape in r["shape"]]
        by_shape[shape] = {"caught": sum(r["status"] == "caught" for r in sub), "cases": len(sub)}
    alarms = [(r["id"], a) for r in rows for a in r.get("false_alarms", [])]
    reviewed = [f"{r['id']}: {a}" for r in rows for a in r.get("fixed_true_findings", [])]
    return {
        "cases": len(rows),
        "covered": len(covered),
        "caught": sum(r["status"] == "caught" for r in covered),
        "recall": (sum(r["status"] == "caught" for r in covered) / len(covered)) if covered else None,
        "by_setup": by_setup,
        "by_kind": by_kind,
        "by_shape": by_shape,
        "uncovered": sum(not r["covered"] for r in ran),
        "uncovered_caught": sum(not r["covered"] and r["status"] == "caught" for r in ran),
        "skipped": [r["id"] for r in rows if r["status"] == "skipped"],
        "errors": [r["id"] for r in rows if r["status"] == "error"],
        "fixed_trees": sum("false_alarms" in r for r in rows),
        "false_alarms": len(alarms),
        "false_alarm_cases": sorted({cid for cid, _ in alarms}),
        "false_alarm_list": [f"{cid}: {a}" for cid, a in alarms],
        "fixed_true_findings": reviewed,
        "reported_setup": [f"{r['id']} ({', '.join(r['reported_setup'])})" for r in rows if r.get("reported_setup")],
        "as_stood": {
            "covered": len(stood_covered),
            "caught": sum(_stood(r)["status"] == "caught" for r in stood_covered),
            "by_setup": stood_split["setup"],
            "by_kind": stood_split["kind"],
            "false_alarms": len(stood_alarms),
            "false_alarm_list": [f"{cid}: {a}" for cid, a in stood_alarms],
        },
    }


def _bench_commit() -> str:
    try:
        proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    commit = proc.stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--", ".", ":!results.md"], cwd=HERE,
                           capture_output=True, text=True, timeout=30).stdout.strip()
    return commit + (" (with uncommitted changes to the benchmark)" if dirty else "")


def render(rows: list[dict], tot: dict, version: str) -> str:
    out = ["# bench/realworld results", ""]
    out.append(f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} at commit {_bench_commit()}.")
    out.append(f"fsdplint: {version}; {tot['cases']} cases "
               f"({sum(r['kind'] == 'handwritten' for r in rows)} handwritten, "
               f"{sum(r['kind'] == 'manifest' for r in rows)} manifest).")
    out.append("")
    n_reported = len(tot["reported_setup"])
    out.append(f"- **Recall** (caught / covered cases that ran"
               + (f", {n_reported} of them with the setup their report states" if n_reported else "")
               + f"): {_pct(tot['caught'], tot['covered'])}")
    for setup, s in tot["by_setup"].items():
        out.append(f"  - setup `{setup}`: {_pct(s['caught'], s['cases'])}")
    for kind, s in tot["by_kind"].items():
        out.append(f"  - {kind} cases: {_pct(s['caught'], s['cases'])}")
    if n_reported:
        stood = tot["as_stood"]
        out.append(f"- Recall as the trees stood (the same cases, without the `reported_*` launch, files and "
                   f"versions): {_pct(stood['caught'], stood['covered'])}")
        for setup, s in stood["by_setup"].items():
            out.append(f"  - setup `{setup}`: {_pct(s['caught'], s['cases'])}")
        for kind, s in stood["by_kind"].items():
            out.append(f"  - {kind} cases: {_pct(s['caught'], s['cases'])}")
        out.append(f"- Cases run with a reported setup: {n_reported} — {', '.join(tot['reported_setup'])}")
    out.append(f"- Uncovered cases (no rule for the failure class): {tot['uncovered']}"
               f" (caught anyway: {tot['uncovered_caught']})")
    out.append(f"- **False alarms** (error findings on fixed trees): {tot['false_alarms']} "
               f"in {len(tot['false_alarm_cases'])} of {tot['fixed_trees']} fixed trees")
    for line in tot["false_alarm_list"]:
        out.append(f"  - {line}")
    if n_reported:
        out.append(f"  - as the trees stood: {tot['as_stood']['false_alarms']}")
        for line in tot["as_stood"]["false_alarm_list"]:
            out.append(f"    - {line}")
    if tot["fixed_true_findings"]:
        out.append(f"- Errors on fixed trees reviewed as true findings unrelated to the case's bug "
                   f"(`fixed_true_findings`, not counted): {len(tot['fixed_true_findings'])}")
        for line in tot["fixed_true_findings"]:
            out.append(f"  - {line}")
    out.append(f"- Skipped (no local copy): {len(tot['skipped'])}"
               + (f" — {', '.join(tot['skipped'])}" if tot["skipped"] else ""))
    out.append(f"- Errors: {len(tot['errors'])}" + (f" — {', '.join(tot['errors'])}" if tot["errors"] else ""))
    out.append("")
    out.append("Recall by shape (a case counts under each of its shapes):")
    out.append("")
    out.append("| shape | caught / covered |")
    out.append("|---|---|")
    for shape, s in tot["by_shape"].items():
        out.append(f"| {shape} | {s['caught']}/{s['cases']} |")
    out.append("")
    out.append("| case | kind | setup | shape | covered | expect | reported setup | result | as the tree stood "
               "| codes found | fixed: errors |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        result = r["status"] + (f" ({r['reason']})" if r.get("reason") else "")
        found = ", ".join(r.get("found", [])) or "-"
        if "false_alarms" in r:
            fixed = ", ".join(a.split(" ", 1)[1] for a in r["false_alarms"]) or "none"
        else:
            fixed = r.get("fixed_error", "-")
        stood = r.get("as_stood")
        stood_text = "-" if stood is None else (
            stood["status"] + (f" ({stood['reason']})" if stood.get("reason") else "")
            + (f": {', '.join(stood.get('found', []))}" if stood.get("found") else ""))
        out.append(f"| {r['id']} | {r['kind']} | {r['setup']} | {', '.join(r['shape'])} | "
                   f"{'yes' if r['covered'] else 'no'} | {', '.join(r['expect']) or '-'} | "
                   f"{', '.join(r.get('reported_setup', [])) or '-'} | {result} | {stood_text} | "
                   f"{found} | {fixed} |")
    out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repos", help="folder of bare git clones named owner+name (for manifest cases)")
    ap.add_argument("--only", help="comma-separated case ids")
    ap.add_argument("--json", help="also write the per-case results as JSON here")
    ap.add_argument("--output", help="write the Markdown report here (default: results.md next to "
                                     "this script, for a full run only)")
    ap.add_argument("--fsdplint", help="the fsdplint command line (default: fsdplint on PATH)")
    ap.add_argument("--bench", help="benchmark folder holding cases/ and manifest*.toml "
                                    "(default: this script's folder)")
    args = ap.parse_args(argv)
    try:
        bench = Path(args.bench).resolve() if args.bench else HERE
        cases = load_cases(bench)
        if args.only:
            wanted = [c.strip() for c in args.only.split(",") if c.strip()]
            unknown = sorted(set(wanted) - {c["id"] for c in cases})
            if unknown:
                raise BenchError(f"unknown case id(s): {', '.join(unknown)}")
            cases = [c for c in cases if c["id"] in wanted]
        linter = Linter(shlex.split(args.fsdplint) if args.fsdplint else default_command())
        repos = Path(args.repos).resolve() if args.repos else None
        if repos is not None and not repos.is_dir():
            raise BenchError(f"--repos {args.repos}: not a directory")
    except BenchError as exc:
        print(f"run.py: {exc}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="fsdplint-realworld-") as tmp:
        for case in cases:
            row = score_case(case, linter, repos, Path(tmp))
            rows.append(row)
            extra = f" [{row['reason']}]" if row.get("reason") else ""
            alarms = f"  fixed: {len(row['false_alarms'])} error(s)" if "false_alarms" in row else ""
            stood = f"  (as stood: {row['as_stood']['status']})" if "as_stood" in row else ""
            print(f"{row['status']:8} {row['id']:55} expect={','.join(row['expect']) or '-':16} "
                  f"found={','.join(row.get('found', [])) or '-'}{extra}{alarms}{stood}", flush=True)
    tot = totals(rows)
    report = render(rows, tot, linter.version())
    print()
    print("\n".join(line for line in report.splitlines()[2:] if not line.startswith("|"))[:3000])
    output = args.output or (None if args.only else str(HERE / "results.md"))
    if output:
        Path(output).write_text(report, encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps({"totals": tot, "cases": rows}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
