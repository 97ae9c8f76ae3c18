"""Render the harness results as bench/results.md (no machine paths in the output)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from measure import Result

GB = 1.5e9 / 2**20  # the 1.5 GB, in MiB
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _clean(text: str, bench) -> str:
    """Replace machine-specific paths with placeholders a reader can follow."""
    repo = str(Path(__file__).resolve().parent.parent)
    venv_bin = str(Path(sys.executable).parent) + "/"
    for old, new in ((str(bench.tmp), "$CORPUS"), (sys.executable, "python"), (venv_bin, ""), (repo + "/", ""),
                     (repo, ".")):
        text = text.replace(old, new)
    return text


def _s(x: float) -> str:
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 100 else f"{x:.0f}"


def _ok(*results: Result | None) -> bool:
    return all(r is not None and r.ok for r in results)


def _loaded(*results: Result) -> bool:
    """Other work on the machine: wall times are inflated, CPU times are the fairer comparison."""
    # The measured command itself adds about 1 to the load average.
    return any(max(r.loads) > CORES + 1 for r in results)


HEADER = ("| command | runs | wall median s | wall min–max s | CPU s | lines/s | peak RSS MiB | load | exit |\n"
          "|---|---|---|---|---|---|---|---|---|")


def _row(res: Result | None, bench, lines: int | None = None, label: str = "") -> str:
    if res is None:
        return f"| {label} | not run | | | | | | | |"
    if not res.ok:
        return f"| {res.label} | {_clean(res.error or 'failed', bench)} | | | | | | | |"
    rate = f"{lines / res.median:,.0f}" if lines else ""
    rss = f"{res.peak_rss:.0f}"
    if res.peak_tree_rss is not None:
        rss += f" ({res.peak_tree_rss:.0f} all processes)"
    return (f"| {res.label} | {len(res.times)} | {_s(res.median)} | {_s(min(res.times))}–{_s(max(res.times))} | "
            f"{_s(res.cpu_median)} | {rate} | {rss} | {max(res.loads):.1f} | {res.rc} |")


def _target(desc: str, limit: float, fmt: str, wall: float | None, cpu: float | None = None,
            loaded: bool = False, detail: str = "") -> str:
    if wall is None:
        return f"| {desc} | n/a | n/a | not measured |"
    judged, on = (cpu, "CPU time; machine loaded") if loaded and cpu is not None else (wall, "")
    status = ("pass" if judged <= limit else "**FAIL**") + (f" ({on})" if on else "")
    cpu_cell = fmt.format(cpu) if cpu is not None else ""
    return f"| {desc} | {fmt.format(wall)}{(' — ' + detail) if detail else ''} | {cpu_cell} | {status} |"


def _ratio_target(desc: str, limit: float, fmt: str, a: Result | None, b: Result | None) -> str:
    if not _ok(a, b):
        return _target(desc, limit, fmt, None)
    return _target(desc, limit, fmt, a.median / b.median, a.cpu_median / b.cpu_median, _loaded(a, b),
                   f"{_s(a.median)} s / {_s(b.median)} s")


def linearity(bench, tool: str = "fsdplint -j 1") -> dict[int, tuple[float, float]]:
    """(wall, CPU) of t(k copies) / (k · t(1 copy)): 1.0 is linear, below is start-up amortised."""
    base = bench.results.get(f"{tool} x1 [scaling]")
    out = {}
    for k in (2, 4):
        res = bench.results.get(f"{tool} x{k} [scaling]")
        if _ok(base, res):
            out[k] = (res.median / (k * base.median), res.cpu_median / (k * base.cpu_median))
    return out


def targets(bench) -> list[str]:
    r = bench.results.get
    out = ["| target (issues 6, 12) | wall | CPU | status |", "|---|---|---|---|"]
    lint1 = r("fsdplint -j 1 x1")
    out.append(_ratio_target("corpus lint ≤ 1.5× libcst parse-only (1 job)", 1.5, "{:.2f}×", lint1,
                             r("parse-only -j 1 x1")))
    out.append(_ratio_target("corpus lint ≤ 0.1× TorchFix (1 job)", 0.1, "{:.3f}×", lint1, r("torchfix -j 1 x1")))
    out.append(_ratio_target("single file ≤ 1.5× `python -c \"import libcst\"`", 1.5, "{:.2f}×",
                             r("fsdplint sample_train.py"), r("python -c 'import libcst'")))
    a70 = r("audit llama3_70b @64")
    ok70 = _ok(a70)
    out.append(_target("Llama-3-70B audit @64 ≤ 15 s", 15, "{:.1f} s", a70.median if ok70 else None,
                       a70.cpu_median if ok70 else None, ok70 and _loaded(a70)))
    out.append(_target(f"Llama-3-70B audit @64 ≤ 1.5 GB RSS ({GB:.0f} MiB)", GB, "{:.0f} MiB",
                       a70.peak_rss if ok70 else None))
    a405 = [a for a in (r(f"audit llama31_405b @{ws}") for ws in (8, 64, 512)) if _ok(a)]
    worst = max(a405, key=lambda a: a.median) if a405 else None
    out.append(_target("Llama-3.1-405B audit ≤ 30 s (slowest world size)", 30, "{:.1f} s",
                       worst.median if worst else None, worst.cpu_median if worst else None,
                       bool(worst) and _loaded(worst), worst.label.split()[-1] if worst else ""))
    lin = linearity(bench)
    out.append(_target("lint time linear in corpus size: t(k×) ≤ 1.15·k·t(1×)", 1.15, "{:.2f}",
                       max(w for w, _ in lin.values()) if lin else None,
                       max(c for _, c in lin.values()) if lin else None,
                       any(_loaded(r(f"fsdplint -j 1 x{k} [scaling]")) for k in (1, *lin)) if lin else False,
                       ", ".join(f"{k}×: {w:.2f}" for k, (w, _) in lin.items())))
    small, big = r("fsdplint 1.25 MB file"), r("fsdplint 5 MB file")
    psmall, pbig = r("parse-only 1.25 MB file"), r("parse-only 5 MB file")
    ok = _ok(small, big, psmall, pbig)
    # libcst's own parse is not linear in the file size here, so fsdplint's work is judged relative to it.
    out.append(_target("no quadratic pass: (fsdplint / parse-only) on 5 MB ≤ 1.15 × on 1.25 MB", 1.15, "{:.2f}",
                       (big.median / pbig.median) / (small.median / psmall.median) if ok else None,
                       (big.cpu_median / pbig.cpu_median) / (small.cpu_median / psmall.cpu_median) if ok else None,
                       ok and _loaded(small, big, psmall, pbig),
                       f"raw t(5 MB)/(4·t(1.25 MB)): fsdplint {big.median / (4 * small.median):.2f}, "
                       f"parse-only {pbig.median / (4 * psmall.median):.2f}" if ok else ""))
    out.append(_ratio_target("whole repository ≤ 1.5× libcst parse-only (1 job, project view, cache)", 1.5,
                             "{:.2f}×", r("fsdplint -j 1 [repo, cache]"), r("parse-only -j 1 [repo]")))
    out.append(_ratio_target("one changed file of 1,000 ≤ 2× the file alone (project view, cache)", 2.0, "{:.2f}×",
                             r("fsdplint train.py [1,000 files, cache]"),
                             r("fsdplint train.py [1,000 files, --no-project]")))
    return out


def _corpus_lines(bench) -> list[str]:
    import corpus as corpus_mod

    c = bench.corpora.get(1)
    if c is None:
        return []
    globs = corpus_mod.SUBSET if bench.args.corpus == "subset" else corpus_mod.FULL
    return [f"Corpus ({bench.args.corpus}): **{c.files} files, {c.lines:,} lines, {c.bytes / 2**20:.1f} MiB**, "
            "copied at run time from the site-packages of the environment above (library versions listed there): "
            + ", ".join(f"`{g}`" for g in globs) + ".", ""]


def _section_corpus(bench) -> list[str]:
    r = bench.results.get
    out = _corpus_lines(bench)
    lines = bench.corpora[1].lines if 1 in bench.corpora else None
    jobs_list = bench.args.jobs
    out.append(HEADER)
    keys = [f"{tool} -j {jobs} x1" for jobs in jobs_list for tool in ("parse-only", "fsdplint", "torchfix")]
    out += [_row(r(k), bench, lines) for k in keys if r(k) is not None]
    out += ["", "Ratios (wall; CPU in parentheses):", ""]
    for jobs in jobs_list:
        lint = r(f"fsdplint -j {jobs} x1")
        cells = []
        for other in ("parse-only", "torchfix"):
            b = r(f"{other} -j {jobs} x1")
            cells.append(f"{lint.median / b.median:.3f}× {other} ({lint.cpu_median / b.cpu_median:.3f}×)"
                         if _ok(lint, b) else f"{other} ratio n/a")
        out.append(f"- -j {jobs}: fsdplint = " + ", ".join(cells))
    out += ["", "Last output line of each tool (last run; TorchFix itself skips files without the string "
            "\"torch\" before parsing):", ""]
    out += [f"- {k}: `{_clean(r(k).last_line, bench)[:200]}`" for k in keys if _ok(r(k))]
    return out


def _section_single(bench) -> list[str]:
    r = bench.results.get
    out = [f"Input: `bench/sample_train.py` (a {_count_lines('sample_train.py')}-line FSDP2 + LoRA training "
           "script).", "", HEADER]
    out += [_row(r(k), bench, label=k) for k in ("python -c pass", "python -c 'import libcst'",
                                                  "fsdplint sample_train.py")]
    return out + ["", *bench.notes.get("single", [])]


def _section_audit(bench) -> list[str]:
    out = ["Configs: `bench/configs/` (Llama-3-8B, Llama-3-70B, Llama-3.1-405B from the public architecture "
           f"numbers). Command: `fsdplint model CONFIG {bench.args.audit_args} --world-size N`.", "",
           "| config | world size | runs | wall median s | wall min–max s | CPU s | peak RSS MiB | load | exit |",
           "|---|---|---|---|---|---|---|---|---|"]
    audits = {k: v for k, v in bench.results.items() if k.startswith("audit ")}
    errors = {v.error for v in audits.values()}
    if len(audits) > 1 and len(errors) == 1 and None not in errors:
        return out + [f"| all | all | {_clean(errors.pop(), bench)} | | | | | | |"]
    for key, res in audits.items():
        _, config, ws = key.split()
        if res.ok:
            out.append(f"| {config} | {ws[1:]} | {len(res.times)} | {_s(res.median)} | "
                       f"{_s(min(res.times))}–{_s(max(res.times))} | {_s(res.cpu_median)} | {res.peak_rss:.0f} | "
                       f"{max(res.loads):.1f} | {res.rc} |")
        else:
            out.append(f"| {config} | {ws[1:]} | {_clean(res.error or 'failed', bench)} | | | | | | |")
    last = [v.last_line for v in audits.values() if v.ok and v.last_line]
    if last:
        out += ["", f"Last output line: `{_clean(last[-1], bench)[:200]}`"]
    return out


def _cell(res: Result | None) -> str:
    if res is None:
        return ""
    return f"{_s(res.median)} ({_s(res.cpu_median)})" if res.ok else "n/a"


def _section_scaling(bench) -> list[str]:
    r = bench.results.get
    lin = linearity(bench)
    plin = linearity(bench, "parse-only -j 1")
    out = ["All commands of this table ran round-robin in one batch. Wall s (CPU s in parentheses).", "",
           "| corpus | files | lines | parse-only -j 1 | fsdplint -j 1 | fsdplint -j 2 | "
           "t(k)/(k·t(1)) wall (CPU) |", "|---|---|---|---|---|---|---|"]
    for k in (1, 2, 4):
        c = bench.corpora.get(k)
        cells = [_cell(r(f"{tool} x{k} [scaling]")) for tool in ("parse-only -j 1", "fsdplint -j 1", "fsdplint -j 2")]
        ratio = "1.00" if k == 1 else (f"{lin[k][0]:.2f} ({lin[k][1]:.2f})" if k in lin else "n/a")
        if k in plin:
            ratio += f"; parse-only {plin[k][0]:.2f} ({plin[k][1]:.2f})"
        out.append(f"| {k}× | {c.files if c else ''} | {f'{c.lines:,}' if c else ''} | {' | '.join(cells)} | {ratio} |")
    out.append("")
    for k in (1, 4):
        a, b = r(f"fsdplint -j 1 x{k} [scaling]"), r(f"fsdplint -j 2 x{k} [scaling]")
        out.append(f"- -j 2 speed-up (wall) on the {k}× corpus: " + (f"{a.median / b.median:.2f}×" if _ok(a, b) else "n/a"))
    return out


def _section_bigfile(bench) -> list[str]:
    r = bench.results.get
    out = ["A generated file (the definitions of `sample_train.py` repeated with new names); the time per MB "
           "must not grow with the size. Wall s (CPU s in parentheses).", "",
           "| file | lines | parse-only | fsdplint | fsdplint wall s/MB | fsdplint / parse-only (CPU) | peak RSS MiB |",
           "|---|---|---|---|---|---|---|"]
    for size, big in sorted(bench.bigfiles.items()):
        p, f = r(f"parse-only {size / 1e6:g} MB file"), r(f"fsdplint {size / 1e6:g} MB file")
        out.append(f"| {size / 1e6:g} MB | {big.lines:,} | {_cell(p)} | {_cell(f)} | "
                   f"{_s(f.median / (big.bytes / 1e6)) if _ok(f) else ''} | "
                   f"{f'{f.cpu_median / p.cpu_median:.2f}×' if _ok(f, p) else ''} | "
                   f"{f'{f.peak_rss:.0f}' if _ok(f) else ''} |")
    errors = {f.error for k, f in bench.results.items() if k.startswith("fsdplint") and "MB file" in k and not f.ok}
    return out + [f"\nfsdplint: {_clean(e, bench)}" for e in errors if e]


def _section_repo(bench) -> list[str]:
    tree = bench.trees.get("repo")
    if tree is None:
        return bench.notes.get("repo", ["Not run."])
    r = bench.results.get
    keys = ["parse-only -j 1 [repo]", "fsdplint -j 1 [repo, cache]", "fsdplint -j 1 [repo, --no-cache]",
            "fsdplint -j 1 [repo, --no-project]"]
    out = [f"Repository: **{tree.files} files, {tree.lines:,} lines** (the `.py` files of `--repo "
           f"{Path(bench.args.repo).name}`, copied; fsdplint's cache in the harness's temporary directory). "
           "`cache`: the project view with the fact-sheet cache filled by the warm-up run; `--no-cache`: every "
           "fact sheet computed again; `--no-project`: each file alone, as before the project view.", "", HEADER]
    out += [_row(r(k), bench, tree.lines, k) for k in keys]
    return out


def _section_changed(bench) -> list[str]:
    tree = bench.trees.get("changed")
    if tree is None:
        return ["Not run."]
    r = bench.results.get
    keys = ["fsdplint train.py [1,000 files, --no-project]", "fsdplint train.py [1,000 files, cache]",
            "fsdplint train.py [1,000 files, --no-cache]"]
    out = [f"A generated project of **{tree.files} files, {tree.lines:,} lines** (`bench/project.py`): "
           "`train.py` imports five of its modules (a loader with LoRA, an FSDP wrapper, three utilities), "
           "which import others. pre-commit passes only `train.py`; the findings need the other modules.", "",
           HEADER]
    out += [_row(r(k), bench, None, k) for k in keys]
    return out


SECTIONS = (
    ("1. Corpus lint", ("corpus",), _section_corpus),
    ("2. Single-file latency", ("single",), _section_single),
    ("3. Model audit", ("audit",), _section_audit),
    ("4. Scaling", ("scaling",), _section_scaling),
    ("5. One big file", ("bigfile",), _section_bigfile),
    ("6. A whole repository (project view)", ("repo",), _section_repo),
    ("7. One changed file in a 1,000-file project", ("changed",), _section_changed),
)


def render(bench, machine_lines: list[str], started, finished) -> str:
    args = bench.args
    out = ["# fsdplint benchmarks", "",
           f"Generated by `python bench/run.py {shlex.join(args.argv)}` on {started:%Y-%m-%d %H:%M} "
           f"({(finished - started).total_seconds() / 60:.1f} min). Regenerate with the harness; see README.md.", "",
           "Times are whole processes (start-up included): median of the measured runs; each tool had one "
           "warm-up run first (not TorchFix nor the big files). CPU is user + system time of the process and its workers. "
           "Peak RSS is the largest single process; for -j 2 the sampled sum over all processes is in "
           "parentheses. \"load\" is the highest 1-minute load average seen before a measured run: above the "
           f"core count + 1 ({CORES + 1}) other work shared the CPUs, wall times are inflated, and targets are judged on "
           "CPU time instead.", "",
           "## Machine", "", *machine_lines, "",
           "## Targets", "", *targets(bench), ""]
    for title, needs, section in SECTIONS:
        out += [f"## {title}", ""]
        out += section(bench) if any(n in args.only for n in needs) else ["Skipped (`--only`)."]
        out.append("")
    if "profile" in bench.notes:
        out += ["## Profile (py-spy, fsdplint -j 1 on the 1× corpus)", "", *bench.notes["profile"], ""]
    if "cold" in bench.notes:
        out += ["## Whole repositories cold (bench/cold.py)", "", *bench.notes["cold"], ""]
    if "warm" in bench.notes:
        out += ["## Warm against cold (bench/warm_cold.py)", "", *bench.notes["warm"], ""]
    if "linear" in bench.notes:
        out += ["## One big file, by size (bench/bigfile.py)", "", *bench.notes["linear"], ""]
    out += ["## Commands", ""]
    out += [f"- {res.label}: `{_clean(shlex.join(res.cmd), bench)}`" for res in bench.results.values()]
    return "\n".join(out) + "\n"


def _count_lines(name: str) -> int:
    return (Path(__file__).resolve().parent / name).read_text().count("\n")
