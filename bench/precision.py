"""Whole-repository precision pass: lint local copies of real projects and count findings per rule.

Each sub-directory of DIR is one project (a plain copy of its tree at some commit). Two ways to run
fsdplint over it, as a user would:

- `cli`: `fsdplint check . --output-format json --exit-zero` inside the project, with this interpreter
  (whatever torch/transformers it has installed is what fsdplint's metadata lookup sees);
- `pre-commit`: `pre-commit try-repo FSDPLINT_REPO fsdplint --all-files` inside the project (pre-commit
  builds its own environment with fsdplint's base dependencies only, so torch is not installed there).
  The project must be a git repository for pre-commit; a copy that is not one gets `git init` and one
  commit of its files.

The findings go to a JSON file (one record per finding). `--triage FILE` reads verdicts written by a
person who read each error finding (`{"repo": ..., "path": ..., "line": ..., "code": ..., "verdict":
"true"|"false", "why": ...}`), and the summary reports per-rule counts and the error precision over
the triaged errors (untriaged errors are listed, not guessed).

    python bench/precision.py DIR --mode cli --out cli.json
    python bench/precision.py DIR --mode pre-commit --fsdplint-repo . --out hook.json
    python bench/precision.py --summary cli.json hook.json --triage triage.json
    python bench/precision.py --compare before=b.json after=a.json --triage triage.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

# `path:row:col: CODE [*] [severity] message` (the `[*]` marks a fixable finding).
_LINE = re.compile(
    r"^(?P<path>[^\s:][^:]*):(?P<row>\d+):(?P<col>\d+): (?P<code>FSDP\d{3})(?: \[\*\])? \[(?P<sev>\w+)\] (?P<msg>.*)$"
)


def _git_ready(project: Path) -> None:
    if (project / ".git").exists():
        return
    env = dict(os.environ, GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@localhost",
               GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="bench@localhost")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "snapshot", "--no-verify"]):
        subprocess.run(cmd, cwd=project, check=True, env=env, stdout=subprocess.DEVNULL)


def run_cli(project: Path, command: list[str]) -> list[dict]:
    proc = subprocess.run([*command, "check", ".", "--output-format", "json", "--exit-zero"], cwd=project,
                          capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{project}: fsdplint exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    out = []
    for f in json.loads(proc.stdout or "[]"):
        out.append({"path": f["filename"].removeprefix("./"), "line": f["location"]["row"], "code": f["code"],
                    "severity": f["severity"], "message": f["message"]})
    return out


def run_pre_commit(project: Path, fsdplint_repo: str, ref: str | None, pre_commit: str) -> list[dict]:
    _git_ready(project)
    cmd = [*shlex.split(pre_commit), "try-repo", fsdplint_repo, "fsdplint", "--all-files"]
    if ref:
        cmd += ["--ref", ref]
    proc = subprocess.run(cmd, cwd=project, capture_output=True, text=True)
    out = []
    for line in proc.stdout.splitlines():
        m = _LINE.match(line)
        if m:
            out.append({"path": m["path"].removeprefix("./"), "line": int(m["row"]), "code": m["code"],
                        "severity": m["sev"], "message": m["msg"]})
    if not out and proc.returncode not in (0, 1):
        raise SystemExit(f"{project}: pre-commit exited {proc.returncode}: {(proc.stdout + proc.stderr)[-2000:]}")
    return out


def lint_all(root: Path, args) -> dict:
    results = {}
    for project in sorted(p for p in root.iterdir() if p.is_dir()):
        if args.only and project.name not in args.only:
            continue
        if args.mode == "cli":
            found = run_cli(project, shlex.split(args.fsdplint))
        else:
            found = run_pre_commit(project, args.fsdplint_repo, args.ref, args.pre_commit)
        lines = sum(_count_lines(p) for p in project.rglob("*.py") if ".git" not in p.parts)
        results[project.name] = {"lines": lines, "findings": found}
        print(f"{project.name}: {len(found)} findings over {lines} lines", file=sys.stderr)
    return results


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _key(repo: str, f: dict) -> tuple:
    return (repo, f["path"], f["line"], f["code"])


def summary(files: list[Path], triage_path: Path | None) -> str:
    triage = {}
    if triage_path is not None:
        for t in json.loads(triage_path.read_text()):
            triage[(t["repo"], t["path"], t["line"], t["code"])] = t
    out = []
    for path in files:
        data = json.loads(path.read_text())
        per_rule: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for repo, r in data.items():
            for f in r["findings"]:
                per_rule[f["code"]][f["severity"]] += 1
        lines = sum(r["lines"] for r in data.values())
        out.append(f"## {path.name}: {len(data)} projects, {lines} lines of Python\n")
        out.append("| Rule | error | warning | info |")
        out.append("|---|---|---|---|")
        for code in sorted(per_rule):
            c = per_rule[code]
            out.append(f"| {code} | {c['error']} | {c['warning']} | {c['info']} |")
        tot = collections.Counter()
        for c in per_rule.values():
            tot.update(c)
        out.append(f"| all | {tot['error']} | {tot['warning']} | {tot['info']} |\n")
        errors = [(repo, f) for repo, r in data.items() for f in r["findings"] if f["severity"] == "error"]
        judged = [triage[_key(repo, f)] for repo, f in errors if _key(repo, f) in triage]
        untriaged = [(repo, f) for repo, f in errors if _key(repo, f) not in triage]
        true = sum(1 for t in judged if t["verdict"] == "true")
        if judged:
            out.append(f"Error precision: {true}/{len(judged)} = {100 * true / len(judged):.1f} % (triaged errors)\n")
        for repo, f in untriaged:
            out.append(f"- untriaged: {repo}/{f['path']}:{f['line']} {f['code']}: {f['message'][:160]}")
        if untriaged:
            out.append("")
    return "\n".join(out)


def compare(labelled: list[str], triage_path: Path | None) -> str:
    """One per-rule table over several finding files (`LABEL=FILE`): error/warning/info counts per column,
    then the error precision of each over the triaged errors."""
    triage = {}
    if triage_path is not None:
        for t in json.loads(triage_path.read_text()):
            triage[(t["repo"], t["path"], t["line"], t["code"])] = t
    cols = []
    for item in labelled:
        label, _, path = item.partition("=")
        cols.append((label, json.loads(Path(path).read_text())))
    codes = sorted({f["code"] for _, d in cols for r in d.values() for f in r["findings"]})
    out = ["| Rule | " + " | ".join(label for label, _ in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for code in [*codes, "all"]:
        cells = []
        for _, d in cols:
            c = collections.Counter(f["severity"] for r in d.values() for f in r["findings"]
                                    if code == "all" or f["code"] == code)
            cells.append(f"{c['error']} / {c['warning']} / {c['info']}")
        out.append(f"| {code} | " + " | ".join(cells) + " |")
    prec = []
    for label, d in cols:
        errors = [_key(repo, f) for repo, r in d.items() for f in r["findings"] if f["severity"] == "error"]
        judged = [triage[k] for k in errors if k in triage]
        true = sum(1 for t in judged if t["verdict"] == "true")
        missing = len(errors) - len(judged)
        share = f"{100 * true / len(judged):.0f} %" if judged else "n/a (no errors)"
        prec.append(f"{true}/{len(judged)} = {share}" + (f" ({missing} untriaged)" if missing else ""))
    out.append("| error precision | " + " | ".join(prec) + " |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", type=Path, help="a directory of project copies, one per sub-directory")
    p.add_argument("--mode", choices=("cli", "pre-commit"), default="cli")
    p.add_argument("--fsdplint", default=f"{shlex.quote(sys.executable)} -m fsdplint",
                   help="the fsdplint command for --mode cli (default: this interpreter's)")
    p.add_argument("--fsdplint-repo", default=str(Path(__file__).resolve().parent.parent),
                   help="the fsdplint git repository pre-commit installs the hook from")
    p.add_argument("--ref", help="the commit of --fsdplint-repo to install (default: its work tree)")
    p.add_argument("--pre-commit", default="pre-commit", help="the pre-commit command")
    p.add_argument("--only", nargs="*", help="only these sub-directories")
    p.add_argument("--out", type=Path, help="write the findings as JSON here")
    p.add_argument("--summary", nargs="*", type=Path, help="summarise finding files instead of linting")
    p.add_argument("--triage", type=Path, help="verdicts for the error findings (JSON list)")
    p.add_argument("--compare", nargs="*", metavar="LABEL=FILE", help="one per-rule table over several finding files")
    args = p.parse_args()
    if args.summary:
        print(summary(args.summary, args.triage))
        return
    if args.compare:
        print(compare(args.compare, args.triage))
        return
    if args.dir is None:
        p.error("DIR is required unless --summary is given")
    results = lint_all(args.dir, args)
    text = json.dumps(results, indent=1)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
