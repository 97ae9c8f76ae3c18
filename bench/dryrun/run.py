"""Score `fsdplint run` on launches: every buggy case must report its rule at the marked line, every
clean case must reach its training step with no error or warning (an info is reported, not failed).

    python bench/dryrun/run.py [--repos DIR] [--only ID,...] [--output results.md]

A case with `repo`/`commit`/`paths` is a public repository's official example: its files are
extracted at run time from a local bare clone under `--repos DIR/owner+name` (as bench/realworld
does) and launched as its README says, the model path flag naming the tiny model directory; without
`--repos` such a case is skipped. Every other case directory is copied to a fresh temporary directory with a model directory written there
(config.json and a tokenizer; no weights) and run with the `fsdplint` command line (never imported).
Wall time and the peak memory of the run (its largest process: the run or one of its simulated
ranks) are recorded per case.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
# The published config.json sizes of the hub models official launchers name (config only; the dry run
# reads nothing else of a model). A case's `hub_configs` puts them in a fresh hub cache, as a machine
# that has run `hf download MODEL config.json` has them; tokenizers and datasets stay uncached, so the
# dry run's stand-ins are exercised.
HUB_CONFIGS = {
    "llama2_70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                       num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096, dtype="float16"),
    "llama3_8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                      dtype="bfloat16"),
    "mistral_7b": dict(model_type="mistral", architectures=["MistralForCausalLM"], hidden_size=4096,
                       intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       vocab_size=32000, max_position_embeddings=32768, sliding_window=4096, dtype="bfloat16"),
    "bert_base_cased": dict(model_type="bert", architectures=["BertForMaskedLM"], hidden_size=768,
                            intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                            vocab_size=28996, max_position_embeddings=512, type_vocab_size=2),
}


# Runs its arguments as a child and writes the largest resident set of that child and every process it
# waited for (ru_maxrss of RUSAGE_CHILDREN, in KiB on Linux).
_PEAK = ("import resource, subprocess, sys\n"
         "r = subprocess.run(sys.argv[1:])\n"
         "sys.stderr.write('\\n@@peak_kib %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
         "sys.exit(r.returncode)\n")


def write_model(d: Path, sizes: dict) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    LlamaConfig(**sizes, dtype="bfloat16", architectures=["LlamaForCausalLM"]).save_pretrained(d)
    vocab = {w: i for i, w in enumerate("[PAD] [UNK] <s> </s> the a cat dog sat on mat hello world".split())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="<s>",
                            eos_token="</s>").save_pretrained(d)


def write_hub_config(cache: Path, repo_id: str, sizes: dict) -> None:
    """config.json of `repo_id` in huggingface_hub's cache layout (refs/main -> snapshots/<rev>/)."""
    from transformers import AutoConfig

    sizes = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **sizes}
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    rev = "0" * 39 + "1"
    AutoConfig.for_model(**sizes).save_pretrained(repo / "snapshots" / rev)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(rev)


def _realworld():
    import importlib.util

    spec = importlib.util.spec_from_file_location("realworld_run", HERE.parent / "realworld" / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_case(case: dict, repos: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="dryrun-") as tmp:
        work = Path(tmp) / case["id"]
        if case.get("repo"):
            rw = _realworld()
            git_dir = rw.find_git_dir(repos, case["repo"]) if repos else None
            if git_dir is None:
                return {"id": case["id"], "ok": None, "why": "skipped: no local copy of " + case["repo"],
                        "seconds": 0.0, "peak_mib": 0.0, "expect": case["expect"]}
            err = rw.extract(git_dir, case["commit"], case["paths"], work)
            if err:
                return {"id": case["id"], "ok": False, "why": err, "seconds": 0.0, "peak_mib": 0.0}
        else:
            shutil.copytree(HERE / "cases" / case["id"], work)
        model = work / "model"
        write_model(model, LLAMA70B if case.get("model") == "llama70b" else TINY)
        rows = '{"text": "hello world the cat"}\n{"text": "the dog sat on the mat"}\n'
        (work / "data.jsonl").write_text(rows)
        (work / "data").mkdir(exist_ok=True)  # a local dataset directory, for `--dataset_name data`
        (work / "data" / "train.jsonl").write_text(rows)
        env = {**os.environ, "MODEL": str(model), "PYTHONPATH": str(ROOT)}
        if case.get("hub_configs"):
            env["HF_HUB_CACHE"] = str(Path(tmp) / "hub")
            for repo_id, sizes in case["hub_configs"].items():
                write_hub_config(Path(tmp) / "hub", repo_id, HUB_CONFIGS[sizes])
        if case.get("pythonpath"):  # the repository's package, as `pip install -e .` would make it importable
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [str(work / p) for p in case["pythonpath"]])
        run_in = work / case.get("cwd", ".")  # the directory the repository's launcher runs from
        words = [str(model) if w == "$MODEL" else w for w in shlex.split(case["launch"])]
        cmd = [sys.executable, "-m", "fsdplint", "run", "--output-format", "json"]
        if case.get("world_size"):
            cmd += ["--world-size", str(case["world_size"])]
        if case.get("until"):  # "save": the run goes on past the first step to the job's first save
            cmd += ["--until", case["until"]]
        started = time.perf_counter()
        # Through a fresh parent per case, so the peak is this case's largest process (the run or one of
        # its ranks), not the largest of the whole benchmark so far.
        p = subprocess.run([sys.executable, "-c", _PEAK, *cmd, "--", *words], cwd=run_in, env=env,
                           capture_output=True, text=True, timeout=900)
        seconds = time.perf_counter() - started
        marks = re.findall(r"^@@peak_kib (\d+)$", p.stderr, re.M)
        peak = int(marks[-1]) / 1024 if marks else 0.0
        try:
            found = json.loads(p.stdout)
        except ValueError:
            return {"id": case["id"], "ok": False, "why": f"exit {p.returncode}: {p.stderr.strip()[-300:]}",
                    "seconds": seconds, "peak_mib": peak}
        name = case.get("file", "train.py")  # an official example names its file and line
        script = run_in / name
        marked = case.get("line") or (next((i for i, l in enumerate(script.read_text().splitlines(), 1)
                                            if "# BUG" in l), None) if script.is_file() else None)
    codes = sorted({f["code"] for f in found})
    if case["expect"] == "clean":
        # An info (FSDP502: ranks whose shards hold no trainable elements) is a fact about the plan, not a
        # failure: as for `check` at its default --fail-level, only errors and warnings make a case unclean.
        failing = [f for f in found if f["severity"] in ("error", "warning")]
        ok = p.returncode == 0 and not failing
        infos = sorted({f["code"] for f in found if f not in failing})
        why = ("clean" + (f" (infos: {', '.join(infos)})" if infos else "")) if ok else f"reported {codes}"
    else:
        hits = [f for f in found if f["code"] == case["expect"] and f["filename"] == name
                and f["location"]["row"] == marked]
        ok = bool(hits)
        why = f"{case['expect']} at {name}:{marked}" if ok else f"reported {[(f['code'], f['location']['row']) for f in found]}"
    return {"id": case["id"], "ok": ok, "why": why, "seconds": seconds, "peak_mib": peak, "expect": case["expect"],
            "reached": _reached(p.stderr)}


def _reached(summary: str) -> str:
    """Where the simulated ranks stopped, from the run's summary: "step", "forward (autocast)", ..."""
    stops = []
    for line in summary.splitlines():
        line = line.strip()
        if not re.match(r"rank \d+: ", line):
            continue
        text = line.split(": ", 1)[1]
        stops.append("step" if text.startswith("reached the first optimizer step") else
                     "save" if text.startswith("reached its first save") else
                     "end" if text.startswith("ran to its end after its first optimizer step") else
                     "forward (autocast)" if "under CUDA autocast" in text else
                     "forward" if text.startswith("stopped at its first training forward") else
                     "raised" if text.startswith("raised") else text.split(" (")[0])
    return "/".join(dict.fromkeys(stops)) or "-"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--output")
    ap.add_argument("--repos", type=Path, help="folder of bare clones (owner+name) for the official examples")
    a = ap.parse_args()
    cases = tomllib.loads((HERE / "manifest.toml").read_text())["case"]
    if a.only:
        cases = [c for c in cases if c["id"] in a.only.split(",")]
    rows = []
    for c in cases:
        r = run_case(c, a.repos)
        rows.append(r)
        print(f"{'skip' if r['ok'] is None else 'ok ' if r['ok'] else 'MISS'} {r['id']:<34} {r['why']:<40} {r['seconds']:6.1f}s {r['peak_mib']:7.0f} MiB  {r.get('reached', '')}",
              flush=True)
    ran = [r for r in rows if r["ok"] is not None]
    ok = sum(bool(r["ok"]) for r in ran)
    print(f"{ok}/{len(ran)} as expected" + (f" ({len(rows) - len(ran)} skipped)" if len(ran) < len(rows) else ""))
    if a.output:
        Path(a.output).write_text(json.dumps(rows, indent=1))
    return 0 if ok == len(ran) else 1


if __name__ == "__main__":
    sys.exit(main())
