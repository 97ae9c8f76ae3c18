"""Render the harness results as bench/results.md (no machine paths in the output)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from measure import Result

GB = 1.5e9 / 2**20  # the 1.5 GB, in MiB


def _clean(text: str, bench) -> str:
    """Replace machine-specific paths with placeholders a reader can follow."""
    repo = str(Path(__file__).resolve().parent.parent)
    venv_bin = str(Path(sys.executable).parent) + "/"
    for old, new in ((str(bench.tmp), "$CORPUS"), (sys.executable, "python"), (venv_bin, ""), (repo + "/", ""),
                     (repo, ".")):
        text = text.replace(old, new)
    return text


def _cmd(res: Result, bench) -> str:
    return "`" + _clean(shlex.join(res.cmd), bench) + "`"


def _s(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def _row(res: Result | None, bench, lines: int | None = None, label: str | None = None) -> str:
    if res is None:
        return f"| {label} | not run | | | | | | |"
    name = label or res.label
    if not res.ok:
        return f"| {name} | {_clean(res.error or 'failed', bench)} | | | | | | |"
    rate = f"{lines / res.median:,.0f}" if lines else ""
    rss = f"{res.peak_rss:.0f}"
    if res.peak_tree_rss is not None:
        rss += f" ({res.peak_tree_rss:.0f} all processes)"
    return (f"| {name} | {len(res.times)} | {_s(res.median)} | {_s(min(res.times))}–{_s(max(res.times))} | "
            f"{rate} | {rss} | {max(res.loads):.1f} | {res.rc} |")


HEADER = ("| command | runs | median s | min–max s | lines/s | peak RSS MiB | load | exit |\n"
          "|---|---|---|---|---|---|---|---|")


def _ratio(a: Result | None, b: Result | None) -> float | None:
    if a is None or b is None or not a.ok or not b.ok:
        return None
    return a.median / b.median


def _target(desc: str, value: float | None, limit: float, fmt: str, detail: str = "") -> str:
    if value is None:
        return f"| {desc} | n/a{(' — ' + detail) if detail else ''} | not measured |"
    status = "pass" if value <= limit else "**FAIL**"
    return f"| {desc} | {fmt.format(value)}{(' — ' + detail) if detail else ''} | {status} |"


def targets(bench) -> list[str]:
    r = bench.results.get
    out = ["| target (issue 6) | measured | status |", "|---|---|---|"]
    lint1, parse1, tf1 = r("fsdplint -j 1 x1"), r("parse-only -j 1 x1"), r("torchfix -j 1 x1")
    out.append(_target("corpus lint ≤ 1.5× libcst parse-only (1 job)", _ratio(lint1, parse1), 1.5, "{:.2f}×",
                       _pair(lint1, parse1)))
    out.append(_target("corpus lint ≤ 0.1× TorchFix (1 job)", _ratio(lint1, tf1), 0.1, "{:.3f}×", _pair(lint1, tf1)))
    single, libcst = r("fsdplint sample_train.py"), r("python -c 'import libcst'")
    out.append(_target("single file ≤ 1.5× `python -c \"import libcst\"`", _ratio(single, libcst), 1.5, "{:.2f}×",
                       _pair(single, libcst)))
    a70 = r("audit llama3_70b @64")
    ok70 = a70 is not None and a70.ok
    out.append(_target("Llama-3-70B audit @64 ≤ 15 s", a70.median if ok70 else None, 15, "{:.1f} s"))
    out.append(_target("Llama-3-70B audit @64 ≤ 1.5 GB RSS", a70.peak_rss if ok70 else None, GB,
                       "{:.0f} MiB", f"limit {GB:.0f} MiB"))
    a405 = [r(f"audit llama31_405b @{ws}") for ws in (8, 64, 512)]
    a405 = [a for a in a405 if a is not None and a.ok]
    worst = max(a405, key=lambda a: a.median) if a405 else None
    out.append(_target("Llama-3.1-405B audit ≤ 30 s (slowest world size)", worst.median if worst else None, 30,
                       "{:.1f} s", worst.label.split()[-1] if worst else ""))
    lin = linearity(bench)
    out.append(_target("lint time linear in corpus size (t(k×) ≤ 1.15·k·t(1×))", max(lin.values()) if lin else None,
                       1.15, "{:.2f}", ", ".join(f"{k}×: {v:.2f}" for k, v in lin.items())))
    small, big = r("fsdplint 1.25 MB file"), r("fsdplint 5 MB file")
    ok = small is not None and big is not None and small.ok and big.ok
    out.append(_target("no quadratic pass: 5 MB file ≤ 1.15 × 4 × the 1.25 MB file", big.median / (4 * small.median)
                       if ok else None, 1.15, "{:.2f}", _pair(big, small) if ok else ""))
    return out


def _pair(a: Result | None, b: Result | None) -> str:
    if a is None or b is None or not a.ok or not b.ok:
        return ""
    return f"{_s(a.median)} s / {_s(b.median)} s"


def linearity(bench) -> dict[int, float]:
    """t(k copies) / (k · t(1 copy)) for the one-job lint: 1.0 is linear, below is start-up amortised."""
    base = bench.results.get("fsdplint -j 1 x1")
    out = {}
    for k in (2, 4):
        res = bench.results.get(f"fsdplint -j 1 x{k}")
        if base is not None and res is not None and base.ok and res.ok:
            out[k] = res.median / (k * base.median)
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


def render(bench, machine_lines: list[str], started, finished) -> str:
    args = bench.args
    r = bench.results.get
    ran = set(args.only)
    out = ["# fsdplint benchmarks", "",
           f"Generated by `python bench/run.py {' '.join(args.argv)}` on {started:%Y-%m-%d %H:%M} "
           f"({(finished - started).total_seconds() / 60:.1f} min). Regenerate with the harness; see README.md.",
           "Times are whole processes (start-up included): median of the measured runs after one warm-up run "
           "(none for TorchFix). Peak RSS is the largest single process; with -j 2 the sampled sum over all "
           "processes is in parentheses. \"load\" is the highest 1-minute load average seen before a measured run "
           "(other work on the machine; above the core count, times are inflated).", "",
           "## Machine", "", *machine_lines, "",
           "## Targets", "", *targets(bench), ""]

    out += ["## 1. Corpus lint", ""]
    if "corpus" in ran or "scaling" in ran:
        out += _corpus_lines(bench)
        lines = bench.corpora[1].lines if 1 in bench.corpora else None
        out += [HEADER]
        for jobs in args.jobs if "corpus" in ran else [1, 2]:
            for key in (f"parse-only -j {jobs} x1", f"fsdplint -j {jobs} x1", f"torchfix -j {jobs} x1"):
                if r(key) is not None:
                    out.append(_row(r(key), bench, lines))
        out += ["", "Last output line of each tool (last run):", ""]
        for jobs in args.jobs:
            for key in (f"parse-only -j {jobs} x1", f"fsdplint -j {jobs} x1", f"torchfix -j {jobs} x1"):
                if r(key) is not None and r(key).ok:
                    out.append(f"- {key}: `{_clean(r(key).last_line, bench)[:200]}`")
        out += ["", "TorchFix itself skips files that do not contain the string \"torch\" before parsing.", "",
                "Ratios per job count (fsdplint / parse-only, fsdplint / TorchFix):", ""]
        for jobs in args.jobs:
            p, t = _ratio(r(f"fsdplint -j {jobs} x1"), r(f"parse-only -j {jobs} x1")), \
                _ratio(r(f"fsdplint -j {jobs} x1"), r(f"torchfix -j {jobs} x1"))
            out.append(f"- -j {jobs}: " + (f"{p:.2f}× parse-only" if p else "parse-only ratio n/a") + ", "
                       + (f"{t:.3f}× TorchFix" if t else "TorchFix ratio n/a"))
    else:
        out.append("Skipped (`--only`).")
    out.append("")

    out += ["## 2. Single-file latency", ""]
    if "single" in ran:
        out += [f"Input: `bench/sample_train.py` (a {_count_lines('sample_train.py')}-line FSDP2 + LoRA training "
                "script).", "", HEADER]
        for key in ("python -c pass", "python -c 'import libcst'", "fsdplint sample_train.py"):
            out.append(_row(r(key), bench))
        out += ["", *bench.notes.get("single", [])]
    else:
        out.append("Skipped (`--only`).")
    out.append("")

    out += ["## 3. Model audit", ""]
    if "audit" in ran:
        out += ["Configs: `bench/configs/` (Llama-3-8B, Llama-3-70B, Llama-3.1-405B from the public architecture "
                "numbers). Command: `fsdplint model CONFIG " + args.audit_args + " --world-size N`.", "",
                "| config | world size | runs | median s | min–max s | peak RSS MiB | load | exit |",
                "|---|---|---|---|---|---|---|---|"]
        audits = {k: v for k, v in bench.results.items() if k.startswith("audit ")}
        errors = {v.error for v in audits.values()}
        if len(audits) > 1 and len(errors) == 1 and None not in errors:
            out.append(f"| all | all | {_clean(errors.pop(), bench)} | | | | | |")
            audits = {}
        for key, res in audits.items():
            if True:
                _, config, ws = key.split()
                if res.ok:
                    out.append(f"| {config} | {ws[1:]} | {len(res.times)} | {_s(res.median)} | "
                               f"{_s(min(res.times))}–{_s(max(res.times))} | {res.peak_rss:.0f} | "
                               f"{max(res.loads):.1f} | {res.rc} |")
                else:
                    out.append(f"| {config} | {ws[1:]} | {_clean(res.error or 'failed', bench)} | | | | | |")
    else:
        out.append("Skipped (`--only`).")
    out.append("")

    out += ["## 4. Scaling", ""]
    if "scaling" in ran:
        out += ["| corpus | files | lines | parse-only -j 1 s | fsdplint -j 1 s | fsdplint -j 2 s | "
                "fsdplint -j 1 t(k)/(k·t(1)) |", "|---|---|---|---|---|---|---|"]
        lin = linearity(bench)
        for k in (1, 2, 4):
            c = bench.corpora.get(k)
            cells = []
            for key in (f"parse-only -j 1 x{k}", f"fsdplint -j 1 x{k}", f"fsdplint -j 2 x{k}"):
                res = r(key)
                cells.append(_s(res.median) if res is not None and res.ok else ("n/a" if res is not None else ""))
            out.append(f"| {k}× | {c.files if c else ''} | {f'{c.lines:,}' if c else ''} | {' | '.join(cells)} | "
                       f"{'1.00' if k == 1 else (f'{lin[k]:.2f}' if k in lin else 'n/a')} |")
        for k in (1, 4):
            sp = _ratio(r(f"fsdplint -j 1 x{k}"), r(f"fsdplint -j 2 x{k}"))
            out.append("")
            out.append(f"-j 2 speed-up on the {k}× corpus: " + (f"{sp:.2f}×" if sp else "n/a"))
    else:
        out.append("Skipped (`--only`).")
    out.append("")

    out += ["## 5. One big file", ""]
    if "bigfile" in ran:
        out += ["A generated file (the definitions of `sample_train.py` repeated with new names); time per MB "
                "must not grow with the size.", "",
                "| file | lines | parse-only s | fsdplint s | fsdplint s/MB | fsdplint / parse-only | peak RSS MiB |",
                "|---|---|---|---|---|---|---|"]
        for size, big in sorted(bench.bigfiles.items()):
            p, f = r(f"parse-only {size / 1e6:g} MB file"), r(f"fsdplint {size / 1e6:g} MB file")
            ok_p, ok_f = p is not None and p.ok, f is not None and f.ok
            out.append(f"| {size / 1e6:g} MB | {big.lines:,} | {_s(p.median) if ok_p else 'n/a'} | "
                       f"{_s(f.median) if ok_f else 'n/a'} | {_s(f.median / (big.bytes / 1e6)) if ok_f else ''} | "
                       f"{f'{f.median / p.median:.2f}×' if ok_f and ok_p else ''} | {f'{f.peak_rss:.0f}' if ok_f else ''} |")
        errs = {f.error for f in bench.results.values() if f.label.startswith("fsdplint") and "MB file" in f.label
                and not f.ok}
        out += [f"fsdplint: {_clean(e, bench)}" for e in errs if e]
    else:
        out.append("Skipped (`--only`).")
    out.append("")

    if "profile" in bench.notes:
        out += ["## Profile (pyinstrument, fsdplint -j 1 on the 1× corpus)", "", *bench.notes["profile"], ""]

    out += ["## Commands", ""]
    for res in bench.results.values():
        out.append(f"- {res.label}: {_cmd(res, bench)}")
    out.append("")
    return "\n".join(out)


def _count_lines(name: str) -> int:
    return (Path(__file__).resolve().parent / name).read_text().count("\n")
