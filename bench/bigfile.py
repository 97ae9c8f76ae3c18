"""One big training file: fsdplint's time and memory against libcst's parse of the same file, at several sizes.

The file is generated: `sample_train.py`'s imports once, then its definitions (a dataclass, a dataset class,
argument parsing, set-up, model building with LoRA and FSDP2, the optimizer, saving, the training loop)
repeated under new names, each copy with some module-level settings of its own, and in the middle of the file
one function that injects LoRA after `fully_shard` (FSDP101): a realistic file with exactly one finding.

Per size, in interleaved rounds (a change of machine load hits every command alike), the minimum over the rounds:
  parse-only  `python bench/parse_only.py FILE` (read and `libcst.parse_module`, nothing else: the floor)
  fsdplint    `python -m fsdplint check FILE --isolated --no-cache --output-format json`
CPU time is user + system of the child (`wait4`), peak RSS its `ru_maxrss`. The report gives fsdplint / parse
per size (goal ≤ 1.5×), the growth t(largest) / (k · t(smallest)) of each (1.0 = linear), fsdplint's peak RSS
against parse-only's (goal ≤ 1.5×), and whether each size gave the one expected finding.

Usage: python bench/bigfile.py [--lines 15000,30000,60000] [--rounds 3] [--keep DIR] [--checkout DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "sample_train.py"

_FINDING = '''

def build_wrapped_model(name: str) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
    for module in model.modules():
        if isinstance(module, LlamaDecoderLayer):
            fully_shard(module)
    fully_shard(model)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    return model
'''

_SETTINGS = '''
RUN_{i}_DEFAULTS = {{"seq_len": {seq}, "batch_size": {bs}, "lr": {lr}, "tag": "run-{i}"}}
RUN_{i}_LAYERS = [f"model.layers.{{n}}.self_attn" for n in range({layers})]
if os.environ.get("RUN_{i}_DEBUG"):
    logger.setLevel(logging.DEBUG)

'''


def generate(lines: int) -> str:
    """A training file of about `lines` lines with one FSDP101 finding in the middle."""
    text = SAMPLE.read_text()
    main_at = text.index('\nif __name__ == "__main__":')
    first_def = min(m.start() for m in re.finditer(r"^(?:@|class |def )", text, re.M))
    head, body = text[:first_def], text[first_def:main_at]
    names = re.findall(r"^(?:class|def) (\w+)", body, re.M)
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    per_copy = body.count("\n") + _SETTINGS.count("\n")
    copies = max(1, (lines - head.count("\n") - _FINDING.count("\n")) // per_copy)
    parts = [head]
    for i in range(copies):
        parts.append(_SETTINGS.format(i=i, seq=512 * (1 + i % 8), bs=1 + i % 4, lr=1e-4 * (1 + i % 5), layers=8 + i % 24))
        parts.append(pattern.sub(lambda m: f"{m.group(1)}_{i}", body))
        if i == copies // 2:
            parts.append(_FINDING)
    return "".join(parts)


def _run(cmd: list[str], env: dict) -> tuple[float, int, bytes]:
    """CPU seconds, peak RSS (KiB) and stdout of one child process."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", default="15000,30000,60000", help="comma-separated sizes in lines")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="write the generated files here and keep them")
    ap.add_argument("--checkout", type=Path, default=HERE.parent,
                    help="the fsdplint source tree measured (default: the one this script belongs to)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.lines.split(",")]
    work = args.keep or Path(tempfile.mkdtemp(prefix="fsdplint-bigfile-"))
    work.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(args.checkout.resolve()), os.environ.get("PYTHONPATH")]))}
    try:
        files = {}
        for n in sizes:
            f = work / f"train_{n}.py"
            f.write_text(generate(n))
            files[n] = f
        cmds = {n: {"parse": [py, str(HERE / "parse_only.py"), str(f)],
                    "lint": [py, "-m", "fsdplint", "check", str(f), "--isolated", "--no-cache", "--exit-zero",
                             "--output-format", "json"]} for n, f in files.items()}
        _run(cmds[sizes[0]]["parse"], env)  # warm-up: bytecode, page cache
        _run(cmds[sizes[0]]["lint"], env)
        best: dict = {}
        loads = []
        for _ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for n in sizes:
                for kind in ("parse", "lint"):
                    cpu, rss, out = _run(cmds[n][kind], env)
                    b = best.setdefault((n, kind), [cpu, rss, out])
                    b[0], b[1] = min(b[0], cpu), max(b[1], rss)
                    if kind == "lint":
                        b[2] = out
        print(f"one generated file per size, {args.rounds} interleaved rounds, min CPU s (user + system), "
              f"1-min load {min(loads):.1f}–{max(loads):.1f}\n")
        print("| lines | parse-only CPU s | fsdplint CPU s | fsdplint / parse | parse-only peak RSS MiB "
              "| fsdplint peak RSS MiB | RSS ratio | findings |")
        print("|---|---|---|---|---|---|---|---|")
        for n in sizes:
            p, lint = best[(n, "parse")], best[(n, "lint")]
            found = [f"{d['code']}@{d['location']['row']}" for d in json.loads(lint[2] or b"[]")]
            real = files[n].read_text().count("\n")
            print(f"| {real:,} | {p[0]:.2f} | {lint[0]:.2f} | {lint[0] / p[0]:.2f}× | {p[1] / 1024:.0f} | "
                  f"{lint[1] / 1024:.0f} | {lint[1] / p[1]:.2f}× | {', '.join(found) or 'none'} |")
        lo, hi = sizes[0], sizes[-1]
        n_lo, n_hi = (files[n].read_text().count("\n") for n in (lo, hi))
        print()
        for kind, label in (("parse", "parse-only"), ("lint", "fsdplint")):
            print(f"- growth {n_lo:,} → {n_hi:,} lines, {label}: t({n_hi:,}) / ({n_hi / n_lo:.2f} · t({n_lo:,})) = "
                  f"{best[(hi, kind)][0] / (n_hi / n_lo * best[(lo, kind)][0]):.2f} (1.00 = linear)")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
