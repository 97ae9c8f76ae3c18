"""fsdplint benchmark harness: times whole processes and writes bench/results.md.

Run from the repository root with the project venv active:

    python bench/run.py                       # all scenarios but profile (~10 min on 2 idle cores)
    python bench/run.py --only single,audit   # a subset
    python bench/run.py --runs 5 --output out.md

Scenarios: corpus (fsdplint vs libcst parse-only vs TorchFix), single (one-file latency),
audit (`fsdplint model` on Llama-3 configs), scaling (-j 1/-j 2, 1x/2x/4x corpus), bigfile
(one generated 1.25/2.5/5 MB file), profile
(py-spy on the corpus lint; opt-in). A tool that is missing or fails is reported as such.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import corpus as corpus_mod  # noqa: E402
import machine  # noqa: E402
import project as project_mod  # noqa: E402
import report  # noqa: E402
from measure import Result, measure_interleaved, unavailable  # noqa: E402

REPO = BENCH.parent
WORK = BENCH / ".work"
TORCHFIX_VERSION = "0.7.0"
TORCHFIX_VENV = WORK / "venv-torchfix"
SAMPLE = BENCH / "sample_train.py"
CONFIGS = ("llama3_8b", "llama3_70b", "llama31_405b")
WORLD_SIZES = (8, 64, 512)
SCENARIOS = ("corpus", "single", "audit", "scaling", "bigfile", "repo", "changed")
BIGFILE_SIZES = (1_250_000, 2_500_000, 5_000_000)
OPTIONAL = ("profile", "cold", "linear", "warm")
HEAVY_IMPORTS = ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "rich")


def log(msg: str) -> None:
    print(msg, flush=True)


def _probe(cmd: list[str], timeout: float = 120) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except (OSError, subprocess.SubprocessError) as exc:
        return -1, str(exc)
    return p.returncode, p.stdout + p.stderr


def _import_costs(text: str, baseline: str = "") -> str:
    """Self import time summed per package (standard library as one), largest first, less the
    same sum for `baseline`; the interpreter's start-up modules (under `site`, `encodings`) are left out."""
    base = _per_package(baseline) if baseline else {}
    per = {k: v - base.get(k, 0) for k, v in _per_package(text).items()}
    ranked = sorted(((k, v) for k, v in per.items() if v >= 50), key=lambda kv: -kv[1])
    shown = [f"{name} {us / 1000:.1f} ms" for name, us in ranked[:6]]
    rest = sum(us for _, us in ranked[6:])
    if rest:
        shown.append(f"{len(ranked) - 6} others {rest / 1000:.1f} ms")
    return ", ".join(shown) if shown else "n/a"


def _per_package(text: str) -> dict[str, int]:
    per: dict[str, int] = {}
    pending: list[tuple[str, int]] = []
    for m in re.finditer(r"^import time:\s+(\d+) \|\s+\d+ \| ( *)(\S+)\s*$", text, re.M):
        pending.append((m.group(3), int(m.group(1))))
        if m.group(2):  # nested: belongs to the next top-level import
            continue
        top = m.group(3).split(".")[0]
        if top not in ("site", "encodings", "zipimport", "_frozen_importlib_external", "sitecustomize", "usercustomize"):
            for name, us in pending:
                root = name.split(".")[0]
                key = "standard library" if root in sys.stdlib_module_names or root.startswith("_") else root
                per[key] = per.get(key, 0) + us
        pending = []
    return per


@dataclass
class Fsdplint:
    """What the installed fsdplint CLI can do (probed, so the harness runs before the CLI is done)."""

    cmd: list[str]
    lint_ok: bool = False
    lint_why: str = ""
    jobs_flag: str | None = None
    no_cache: bool = False
    model_ok: bool = False
    model_why: str = ""
    base: list[str] = field(default_factory=list)  # the bare `fsdplint` command

    @classmethod
    def probe(cls, checkout: Path | None = None) -> "Fsdplint":
        """`checkout`: a source tree to run (`python -m fsdplint` with it first on PYTHONPATH, set by `main`)
        instead of the installed console script."""
        script = Path(sys.executable).with_name("fsdplint")
        if checkout is not None:
            cmd = [sys.executable, "-m", "fsdplint"]
        else:
            cmd = [str(script)] if script.exists() else ([shutil.which("fsdplint")] if shutil.which("fsdplint") else
                                                        [sys.executable, "-m", "fsdplint"])
        tool = cls(cmd)
        rc, text = _probe([*cmd, "--help"])
        if rc != 0:
            why = (text.strip().splitlines() or [f"exit code {rc}"])[-1][:200]
            tool.lint_why = tool.model_why = f"`fsdplint --help` failed: {why}"
            return tool
        if re.search(r"^\s+check\s", text, re.M):  # a command group: lint with the explicit `check`
            tool.cmd = [*cmd, "check"]
            rc, text = _probe([*tool.cmd, "--help"])
        if re.search(r"--jobs\b", text):
            tool.jobs_flag = "--jobs"
        elif re.search(r"(^|[\s,])-j\b", text):
            tool.jobs_flag = "-j"
        tool.no_cache = "--no-cache" in text
        rc, text = _probe([*tool.lint_args(1), str(SAMPLE)])
        tool.lint_ok = rc in (0, 1) and "Traceback (most recent call last)" not in text
        if not tool.lint_ok:
            tool.lint_why = f"`fsdplint {SAMPLE.name}` exited {rc}: " + " | ".join(text.strip().splitlines()[-2:])[:300]
        rc, text = _probe([*cmd, "model", "--help"])
        tool.base = cmd
        tool.model_ok = rc == 0
        if rc != 0:
            tool.model_why = "`fsdplint model --help` failed: " + " | ".join(text.strip().splitlines()[-2:])[:300]
        return tool

    def lint_args(self, jobs: int | None) -> list[str]:
        args = [*self.cmd]
        if self.no_cache:
            args.append("--no-cache")
        if jobs is not None and self.jobs_flag:
            args += [self.jobs_flag, str(jobs)]
        return args


@dataclass
class Bench:
    args: argparse.Namespace
    tmp: Path
    fsdplint: Fsdplint
    results: dict[str, Result] = field(default_factory=dict)
    corpora: dict[int, corpus_mod.Corpus] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    bigfiles: dict[int, corpus_mod.Corpus] = field(default_factory=dict)
    warmed: set = field(default_factory=set)
    trees: dict[str, project_mod.Tree] = field(default_factory=dict)

    # -- helpers ------------------------------------------------------------------------------------
    def corpus(self, copies: int) -> corpus_mod.Corpus:
        if copies not in self.corpora:
            log(f"collecting corpus x{copies} ...")
            self.corpora[copies] = corpus_mod.materialize(self.tmp / f"corpus-x{copies}", self.args.corpus, copies)
        return self.corpora[copies]

    def once(self, key: str, fn) -> Result:
        """Measure once per harness run; scenarios share results (e.g. the 1x -j 1 lint)."""
        if key not in self.results:
            log(f"[{key}]")
            self.results[key] = fn()
        return self.results[key]

    def warmup(self, tool: str) -> int:
        """One warm-up run the first time a tool runs (bytecode, page cache), none after."""
        if tool in self.warmed:
            return 0
        self.warmed.add(tool)
        return 1

    def logfile(self, key: str) -> Path:
        (WORK / "logs").mkdir(parents=True, exist_ok=True)
        return WORK / "logs" / (re.sub(r"[^A-Za-z0-9_.-]+", "_", key) + ".out")

    # -- tools: each returns a spec for `measure_interleaved`, or a Result saying why it cannot run --------
    def parse_spec(self, jobs: int, copies: int = 1):
        cmd = [sys.executable, str(BENCH / "parse_only.py"), "-j", str(jobs), str(self.corpus(copies).root)]
        return {"cmd": cmd, "ok_codes": (0,), "sample_tree": jobs > 1, "tool": "parse-only"}

    def lint_spec(self, jobs: int | None, path: Path, key: str):
        tool = self.fsdplint
        if not tool.lint_ok:
            return unavailable(key, tool.cmd, tool.lint_why)
        if tool.jobs_flag is None and jobs not in (None, 1):
            return unavailable(key, tool.cmd, "the CLI has no -j/--jobs option")
        return {"cmd": [*tool.lint_args(jobs), str(path)], "sample_tree": bool(jobs and jobs > 1), "tool": "fsdplint"}

    def torchfix_spec(self, jobs: int, key: str):
        exe = TORCHFIX_VENV / "bin" / "torchfix"
        if not exe.exists() and not self.args.no_setup:
            setup_torchfix()
        if not exe.exists():
            return unavailable(key, [str(exe)], f"no TorchFix venv at {exe.parent.parent.name}")
        # TorchFix exits 0 with findings; no warm-up run (slow, and its venv's bytecode is compiled already).
        return {"cmd": [str(exe), "--jobs", str(jobs), str(self.corpus(1).root)], "ok_codes": (0,),
                "sample_tree": jobs > 1, "tool": "torchfix"}

    def batch(self, items: list, runs: int) -> None:
        """Measure (key, spec) pairs round-robin; keys measured before are kept (scenarios share them)."""
        todo = []
        for key, item in items:
            if key in self.results:
                continue
            if isinstance(item, Result):
                self.results[key] = item
                continue
            tool = item.pop("tool", key)
            warm = 0 if tool == "torchfix" else self.warmup(tool)
            todo.append({**item, "label": key, "log": self.logfile(key), "warmup": warm})
        if todo:
            log("[" + ", ".join(s["label"] for s in todo) + "]")
            for res in measure_interleaved(todo, runs=runs, echo=log):
                self.results[res.label] = res

    # -- scenarios ------------------------------------------------------------------------------------
    def scenario_corpus(self) -> None:
        for jobs in self.args.jobs:
            root = self.corpus(1).root
            self.batch([(f"parse-only -j {jobs} x1", self.parse_spec(jobs)),
                        (f"fsdplint -j {jobs} x1", self.lint_spec(jobs, root, f"fsdplint -j {jobs} x1"))],
                       self.args.runs)
        if not self.args.no_torchfix:
            for jobs in self.args.jobs:
                key = f"torchfix -j {jobs} x1"
                self.batch([(key, self.torchfix_spec(jobs, key))], self.args.torchfix_runs)

    def scenario_single(self) -> None:
        py = sys.executable
        key = f"fsdplint {SAMPLE.name}"
        lint = self.lint_spec(None, SAMPLE, key)
        self.batch([("python -c pass", {"cmd": [py, "-c", "pass"], "ok_codes": (0,)}),
                    ("python -c 'import libcst'", {"cmd": [py, "-c", "import libcst"], "ok_codes": (0,)}),
                    (key, lint)], self.args.single_runs)
        if not isinstance(lint, Result):
            self.notes["single"] = self._import_check(lint["cmd"])

    def _import_check(self, cmd: list[str]) -> list[str]:
        """Which heavy libraries the one-file lint imports (it should import none of them)."""
        script = Path(cmd[0])
        if script.name != "fsdplint" or not script.exists():
            return []
        rc, text = _probe([sys.executable, "-X", "importtime", str(script), *cmd[1:]])
        _, libcst_text = _probe([sys.executable, "-X", "importtime", "-c", "import libcst"])
        imported = {m.group(1).strip().split(".")[0] for m in re.finditer(r"^import time:.*\|\s*(\S+)\s*$", text, re.M)}
        heavy = [name for name in HEAVY_IMPORTS if name in imported]
        return [f"Heavy imports on the one-file path (`python -X importtime`): "
                f"{', '.join(heavy) if heavy else 'none'} of {', '.join(HEAVY_IMPORTS)}; "
                f"{len(imported)} top-level modules imported in total.", "",
                "Import time of the one-file run per package beyond `python -c \"import libcst\"` (self times as "
                "`-X importtime` reports them, which inflates them a little; the rule files, loaded from their "
                "paths, count only through the helpers they import): " + _import_costs(text, libcst_text) + "."]

    def audit_cmd(self, config: str, world_size: int) -> list[str]:
        cfg = BENCH / "configs" / f"{config}.json"
        return [*(self.fsdplint.base or self.fsdplint.cmd), "model", str(cfg), *self.args.audit_args.split(),
                "--world-size", str(world_size)]

    def scenario_audit(self) -> None:
        tool = self.fsdplint
        for config in CONFIGS:
            for ws in WORLD_SIZES:
                key = f"audit {config} @{ws}"
                cmd = self.audit_cmd(config, ws)
                item = {"cmd": cmd, "tool": "audit"} if tool.model_ok else unavailable(key, cmd, tool.model_why)
                self.batch([(key, item)], self.args.audit_runs)

    def scenario_scaling(self) -> None:
        """1x/2x/4x and -j 1/-j 2, all measured round-robin in one batch so load drift cannot fake a trend."""
        items = []
        for k in (1, 2, 4):
            items.append((f"parse-only -j 1 x{k} [scaling]", {**self.parse_spec(1, k), "tool": "parse-only"}))
        for jobs, copies in ((1, 1), (1, 2), (1, 4), (2, 1), (2, 4)):
            key = f"fsdplint -j {jobs} x{copies} [scaling]"
            items.append((key, self.lint_spec(jobs, self.corpus(copies).root, key)))
        self.batch(items, self.args.runs)

    def scenario_bigfile(self) -> None:
        """One generated file of 1.25, 2.5 and 5 MB: time must grow linearly with the file size."""
        for size in BIGFILE_SIZES:
            big = self.bigfiles.get(size)
            if big is None:
                big = self.bigfiles[size] = corpus_mod.synthetic(self.tmp / "bigfile", size, SAMPLE)
            pkey, fkey = f"parse-only {size / 1e6:g} MB file", f"fsdplint {size / 1e6:g} MB file"
            pcmd = [sys.executable, str(BENCH / "parse_only.py"), str(big.root)]
            lint = self.lint_spec(None, big.root, fkey)
            if isinstance(lint, dict):
                lint["tool"] = "fsdplint-bigfile"  # no warm-up: one run of each is enough here
                self.warmed.add("fsdplint-bigfile")
            self.warmed.add("parse-only-bigfile")
            self.batch([(pkey, {"cmd": pcmd, "ok_codes": (0,), "tool": "parse-only-bigfile"}), (fkey, lint)],
                       self.args.bigfile_runs)

    def project_cmd(self, *extra: str) -> list[str]:
        """The lint command with the project view's options as given (no automatic --no-cache)."""
        tool = self.fsdplint
        return [*tool.cmd, *([tool.jobs_flag, "1"] if tool.jobs_flag else []), "--isolated", "--exit-zero", *extra]

    def scenario_repo(self) -> None:
        """A whole real repository (`--repo PATH`): parse-only versus fsdplint with the project view, with a
        warm fact-sheet cache (the warm-up run fills it), with none (`--no-cache`), and file by file
        (`--no-project`)."""
        if self.args.repo is None:
            self.notes["repo"] = ["Not run: give a repository directory with `--repo PATH` "
                                  "(or FSDPLINT_BENCH_REPO), see README.md."]
            return
        tree = self.trees.get("repo") or project_mod.repository(Path(self.args.repo), self.tmp / "repo")
        self.trees["repo"] = tree
        cache = self.tmp / "repo-cache"
        root = str(tree.root)
        lint_ok = self.fsdplint.lint_ok
        why = self.fsdplint.lint_why

        def spec(key, *extra):
            if not lint_ok:
                return unavailable(key, self.fsdplint.cmd, why)
            return {"cmd": self.project_cmd(*extra, root), "tool": key}

        self.batch([("parse-only -j 1 [repo]", {"cmd": [sys.executable, str(BENCH / "parse_only.py"), root],
                                                "ok_codes": (0,), "tool": "parse-only-repo"}),
                    ("fsdplint -j 1 [repo, cache]", spec("fsdplint-repo-cache", "--cache-dir", str(cache))),
                    ("fsdplint -j 1 [repo, --no-cache]", spec("fsdplint-repo-nocache", "--no-cache")),
                    ("fsdplint -j 1 [repo, --no-project]", spec("fsdplint-repo-noproject", "--no-project"))],
                   self.args.repo_runs)

    def scenario_changed(self) -> None:
        """One changed file in a generated 1,000-file project, as pre-commit lints it: with the project view
        (warm cache; and without a cache) versus the same file linted alone (`--no-project`)."""
        tree = self.trees.get("changed") or project_mod.synthetic(self.tmp / "synthetic", 1000)
        self.trees["changed"] = tree
        cache = self.tmp / "synthetic-cache"
        target = str(tree.target)
        ok, why = self.fsdplint.lint_ok, self.fsdplint.lint_why

        def spec(key, *extra):
            if not ok:
                return unavailable(key, self.fsdplint.cmd, why)
            return {"cmd": self.project_cmd(*extra, target), "tool": key, "cwd": tree.root}

        self.batch([("fsdplint train.py [1,000 files, --no-project]", spec("changed-alone", "--no-project")),
                    ("fsdplint train.py [1,000 files, cache]", spec("changed-cache", "--cache-dir", str(cache))),
                    ("fsdplint train.py [1,000 files, --no-cache]", spec("changed-nocache", "--no-cache"))],
                   self.args.single_runs)

    def _script(self, name: str, argv: list[str]) -> list[str]:
        """Run another benchmark script of bench/ on the same fsdplint; its markdown output, as lines."""
        cmd = [sys.executable, str(BENCH / name), *argv]
        if self.args.checkout is not None:
            cmd += ["--checkout", str(self.args.checkout)]
        log(" ".join(cmd))
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = proc.stdout.rstrip("\n").splitlines()
        if proc.returncode != 0:
            lines.append(f"`{name}` exited {proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-2:])[:300])
        return [f"Command: `python bench/{name} {_display_argv(argv, self.args)}`", "", *lines]

    def scenario_cold(self) -> None:
        """Whole repositories cold (`--trees`, else `--repo`): bench/cold.py, against `--against` if given."""
        trees = self.args.trees or ([self.args.repo] if self.args.repo else [])
        if not trees:
            self.notes["cold"] = ["Not run: give repository directories with `--trees A,B` (or `--repo`)."]
            return
        argv = [*trees, "--rounds", str(self.args.runs)]
        if self.args.against is not None:
            argv += ["--against", str(self.args.against)]
        self.notes["cold"] = self._script("cold.py", argv)

    def scenario_warm(self) -> None:
        """Warm against cold on each tree of `--trees` (else `--repo`): bench/warm_cold.py."""
        trees = self.args.trees or ([self.args.repo] if self.args.repo else [])
        if not trees:
            self.notes["warm"] = ["Not run: give repository directories with `--trees A,B` (or `--repo`)."]
            return
        self.notes["warm"] = [line for t in trees for line in
                              [*self._script("warm_cold.py", [t, "--rounds", str(self.args.runs)]), ""]]

    def scenario_linear(self) -> None:
        """One generated file of 15k, 30k and 60k lines: bench/bigfile.py (time and memory against the parse)."""
        self.notes["linear"] = self._script("bigfile.py", ["--rounds", str(self.args.bigfile_runs)])

    def scenario_profile(self) -> None:
        """py-spy over the one-job corpus lint; the top costs go into results.md."""
        import profiling

        tool = self.fsdplint
        if not tool.lint_ok:
            self.notes["profile"] = [f"Profile: fsdplint not available ({tool.lint_why})."]
            return
        argv = [*tool.lint_args(1), str(self.corpus(1).root)]
        self.notes["profile"] = profiling.profile(argv, WORK / "profile", echo=log)


def setup_torchfix() -> None:
    """TorchFix pins libcst < 1.6, so it gets its own venv (never the project venv)."""
    log(f"creating {TORCHFIX_VENV.relative_to(REPO)} with torchfix=={TORCHFIX_VERSION} ...")
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", str(TORCHFIX_VENV)], check=True)
    subprocess.run([str(TORCHFIX_VENV / "bin" / "pip"), "install", "-q", f"torchfix=={TORCHFIX_VERSION}"], check=True)


def _rules_summary() -> str:
    try:
        from fsdplint.registry import all_rules
        from fsdplint.rule import Rule

        rules = all_rules()
    except Exception as exc:  # the harness must run whatever state fsdplint is in
        return f"unavailable ({type(exc).__name__})"
    static = [r.code for r in rules if r.check is not Rule.check]
    return f"{len(rules)} rules registered, {len(static)} with a static check ({', '.join(static) or 'none'})"


def _torchfix_libcst() -> str:
    rc, text = _probe([str(TORCHFIX_VENV / "bin" / "python"), "-c", "import libcst, importlib.metadata as m; "
                       "print(m.version('torchfix'), m.version('libcst'))"])
    if rc != 0:
        return "not installed"
    tf, cst = text.split()
    return f"torchfix {tf} with libcst {cst} (own venv)"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(SCENARIOS),
                    help=f"comma-separated scenarios: {', '.join(SCENARIOS + OPTIONAL)} (default: all but profile)")
    ap.add_argument("--runs", type=int, default=3, help="measured runs per corpus command (median, min, max)")
    ap.add_argument("--torchfix-runs", type=int, default=2, help="measured runs per TorchFix command")
    ap.add_argument("--single-runs", type=int, default=10, help="measured runs per one-file command")
    ap.add_argument("--audit-runs", type=int, default=2, help="measured runs per model-audit command")
    ap.add_argument("--bigfile-runs", type=int, default=1, help="measured runs per big-file command")
    ap.add_argument("--jobs", default="1,2", help="job counts for the corpus scenario (default 1,2)")
    ap.add_argument("--corpus", choices=("subset", "full"), default="subset",
                    help="the fixed subset (default) or the full library trees (hours with TorchFix)")
    ap.add_argument("--audit-args", default="--lora --target-modules q_proj,v_proj --r 16 --fsdp 2",
                    help="arguments for `fsdplint model CONFIG` (the world size is added)")
    ap.add_argument("--repo", default=os.environ.get("FSDPLINT_BENCH_REPO"),
                    help="a repository directory for the whole-repository scenario (copied; default: FSDPLINT_BENCH_REPO)")
    ap.add_argument("--repo-runs", type=int, default=2, help="measured runs per whole-repository command")
    ap.add_argument("--no-torchfix", action="store_true", help="skip TorchFix")
    ap.add_argument("--no-setup", action="store_true", help="do not create the TorchFix venv when it is missing")
    ap.add_argument("--checkout", type=Path, default=None,
                    help="an fsdplint source tree (fsdplint/ and rules/, e.g. `git archive REV fsdplint rules | "
                         "tar -x -C DIR` or a worktree) to measure instead of the installed CLI: A/B runs of revisions")
    ap.add_argument("--against", type=Path, default=None,
                    help="cold scenario: another fsdplint source tree measured in the same interleaved rounds")
    ap.add_argument("--trees", default="", help="cold scenario: comma-separated repository directories")
    ap.add_argument("--output", type=Path, default=BENCH / "results.md")
    args = ap.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(args.only) - set(SCENARIOS + OPTIONAL)
    if unknown:
        ap.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    args.jobs = [int(j) for j in args.jobs.split(",")]
    args.trees = [t for t in args.trees.split(",") if t]
    args.checkout = args.checkout.resolve() if args.checkout is not None else None
    args.argv = sys.argv[1:] if argv is None else argv
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    # On SIGTERM, unwind normally so the temporary corpus copies are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = datetime.datetime.now()
    if args.checkout is not None:  # every fsdplint the harness starts (and the scripts it runs) is this one
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.checkout), os.environ.get("PYTHONPATH")]))
    tool = Fsdplint.probe(args.checkout)
    log(f"fsdplint lint: {'ok' if tool.lint_ok else tool.lint_why}; jobs flag: {tool.jobs_flag}; "
        f"model: {'ok' if tool.model_ok else tool.model_why}")
    with tempfile.TemporaryDirectory(prefix="fsdplint-bench-") as tmp:
        bench = Bench(args, Path(tmp), tool)
        for name in args.only:
            log(f"== {name}")
            getattr(bench, f"scenario_{name}")()
        env = {"fsdplint rules": _rules_summary(), "TorchFix": _torchfix_libcst(), "Static CLI": " ".join([Path(tool.cmd[0]).name, *tool.lint_args(1)[1:]])}
        if args.checkout is not None:  # (the revision above is the harness's own checkout)
            env["Measured source tree"] = f"`--checkout {args.checkout.name}`"
        text = report.render(bench, machine.describe(REPO, env), started, datetime.datetime.now())
    # Keep the sections other scripts write into results.md (bench/audit_vs_gloo.py, bench/precision.py).
    old = args.output.read_text() if args.output.is_file() else ""
    for name in KEPT_SECTIONS:
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        if start in old and end in old:
            text = text.rstrip("\n") + "\n\n" + old[old.index(start): old.index(end) + len(end)] + "\n"
    args.output.write_text(text)
    log(f"wrote {args.output}")


KEPT_SECTIONS = ("audit-vs-gloo", "precision")


def _display_argv(argv: list[str], args) -> str:
    """The script's arguments as results.md shows them: directories by their names only."""
    return " ".join(Path(a).name if os.path.isabs(a) else a for a in argv)


if __name__ == "__main__":
    main()
