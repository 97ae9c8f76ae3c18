"""Score `fsdplint run` on launches: every buggy case must report its rule at the marked line, every
clean case must reach its training step with no finding.

    python bench/dryrun/run.py [--only ID,...] [--output results.md]

Each case directory is copied to a fresh temporary directory with a model directory written there
(config.json and a tokenizer; no weights) and run with the `fsdplint` command line (never imported).
Wall time and the peak memory of the run (its largest process) are recorded per case.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=128)
LLAMA70B = dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0)


def write_model(d: Path, sizes: dict) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    LlamaConfig(**sizes, dtype="bfloat16", architectures=["LlamaForCausalLM"]).save_pretrained(d)
    vocab = {w: i for i, w in enumerate("[PAD] [UNK] <s> </s> the a cat dog sat on mat hello world".split())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="<s>",
                            eos_token="</s>").save_pretrained(d)


def run_case(case: dict) -> dict:
    src = HERE / "cases" / case["id"]
    with tempfile.TemporaryDirectory(prefix="dryrun-") as tmp:
        work = Path(tmp) / case["id"]
        shutil.copytree(src, work)
        model = work / "model"
        write_model(model, LLAMA70B if case.get("model") == "llama70b" else TINY)
        (work / "data.jsonl").write_text('{"text": "hello world the cat"}\n{"text": "the dog sat on the mat"}\n')
        env = {**os.environ, "MODEL": str(model), "PYTHONPATH": str(ROOT)}
        words = [str(model) if w == "$MODEL" else w for w in shlex.split(case["launch"])]
        cmd = [sys.executable, "-m", "fsdplint", "run", "--output-format", "json"]
        if case.get("world_size"):
            cmd += ["--world-size", str(case["world_size"])]
        started = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        p = subprocess.run([*cmd, "--", *words], cwd=work, env=env, capture_output=True, text=True, timeout=900)
        seconds = time.perf_counter() - started
        peak = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before) / 1024
        try:
            found = json.loads(p.stdout)
        except ValueError:
            return {"id": case["id"], "ok": False, "why": f"exit {p.returncode}: {p.stderr.strip()[-300:]}",
                    "seconds": seconds, "peak_mib": peak}
        marked = next((i for i, l in enumerate((work / "train.py").read_text().splitlines(), 1) if "# BUG" in l), None)
    codes = sorted({f["code"] for f in found})
    if case["expect"] == "clean":
        ok = p.returncode == 0 and not found
        why = "clean" if ok else f"reported {codes}"
    else:
        hits = [f for f in found if f["code"] == case["expect"] and f["filename"] == "train.py"
                and f["location"]["row"] == marked]
        ok = bool(hits)
        why = f"{case['expect']} at train.py:{marked}" if ok else f"reported {[(f['code'], f['location']['row']) for f in found]}"
    return {"id": case["id"], "ok": ok, "why": why, "seconds": seconds, "peak_mib": peak, "expect": case["expect"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--output")
    a = ap.parse_args()
    cases = tomllib.loads((HERE / "manifest.toml").read_text())["case"]
    if a.only:
        cases = [c for c in cases if c["id"] in a.only.split(",")]
    rows = []
    for c in cases:
        r = run_case(c)
        rows.append(r)
        print(f"{'ok ' if r['ok'] else 'MISS'} {r['id']:<34} {r['why']:<40} {r['seconds']:6.1f}s {r['peak_mib']:7.0f} MiB",
              flush=True)
    ok = sum(r["ok"] for r in rows)
    print(f"{ok}/{len(rows)} as expected")
    if a.output:
        Path(a.output).write_text(json.dumps(rows, indent=1))
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
