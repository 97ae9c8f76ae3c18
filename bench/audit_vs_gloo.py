"""The model audit's per-rank memory figures against real multi-process gloo runs on CPU.

For each case the audit runs in this process (`fsdplint.audit.run_audit`, meta device, fake process
group), then the same model is built for real with the same seed in N processes (torch.multiprocessing,
gloo, CPU), wrapped with FSDP1 (`FullyShardedDataParallel`, peft's policy, device_id=cpu) or FSDP2
(`fully_shard` per decoder layer, then the root), and trained for one step (forward, backward, AdamW
step). Every rank reports the bytes of what it really holds: its parameter shards (real elements and
padding), gradients, AdamW exp_avg + exp_avg_sq, AdamW step counters and, for 4-bit, the replicated
packed weights and bnb's quant_state. The activation section compares the audit's estimate with the
peak torch's MemTracker sees in a real CPU forward+backward (full fine-tuning: MemTracker cannot hook
frozen parameters).

    python bench/audit_vs_gloo.py                    # prints the tables, updates bench/results.md
    python bench/audit_vs_gloo.py --no-write         # print only
    python bench/audit_vs_gloo.py --only llama       # one architecture

Small configs (2 decoder layers, hidden 64/128): the whole run takes a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.md"
START, END = "<!-- audit-vs-gloo:start -->", "<!-- audit-vs-gloo:end -->"

BASE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512}
ARCHS = {
    "llama": ({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False},
              "LlamaDecoderLayer"),
    "qwen2": ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "tie_word_embeddings": True},
              "Qwen2DecoderLayer"),
    "mixtral": ({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 4,
                 "num_experts_per_tok": 2}, "MixtralDecoderLayer"),
}
LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}
QUANT = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "float32",
         "bnb_4bit_quant_storage": "uint8", "bnb_4bit_use_double_quant": True}
# (arch, FSDP version, use_orig_params, 4-bit)
CASES = [(a, v, u, False) for a in ARCHS for v, u in ((1, False), (1, True), (2, False))] + [("llama", 2, False, True)]
WORLD_SIZES = (2, 3)
COLUMNS = ("params", "padding", "grads", "adamw", "steps", "replicated", "quant_state")


def config(arch: str) -> dict:
    return dict(BASE, **ARCHS[arch][0])


# -- the real run (one process per rank) ------------------------------------------------------------

def build_real(arch: str, four_bit: bool):
    import peft
    import torch
    import transformers
    from transformers import AutoConfig

    cfg = config(arch)
    model_type, archs = cfg.pop("model_type"), cfg.pop("architectures")
    torch.manual_seed(0)
    model = getattr(transformers, archs[0])._from_config(AutoConfig.for_model(model_type, **cfg),
                                                         dtype=torch.float32)
    if four_bit:
        import bitsandbytes as bnb
        from transformers import BitsAndBytesConfig
        from transformers.quantizers import AutoHfQuantizer

        q = dict(QUANT, bnb_4bit_compute_dtype=torch.float32, bnb_4bit_quant_storage=torch.uint8)
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        quantizer = AutoHfQuantizer.from_config(BitsAndBytesConfig(**q))
        quantizer.preprocess_model(model, device_map={"": "cpu"}, dtype=torch.float32)
        for name, mod in model.named_modules():
            if isinstance(mod, bnb.nn.Linear4bit):  # what loading does: quantize on the device
                mod.weight = bnb.nn.Params4bit(weights[name + ".weight"], requires_grad=False, quant_type="nf4",
                                               compress_statistics=True, quant_storage=torch.uint8,
                                               module=mod).to("cpu")
        quantizer.postprocess_model(model)
    return peft.get_peft_model(model, peft.LoraConfig(**LORA))


def wrap_real(model, arch: str, version: int, use_orig: bool):
    import torch

    layer_cls = ARCHS[arch][1]
    if version == 1:
        from peft.utils.other import fsdp_auto_wrap_policy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        os.environ["FSDP_TRANSFORMER_CLS_TO_WRAP"] = layer_cls
        return FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), device_id=torch.device("cpu"),
                    use_orig_params=use_orig)
    from torch.distributed.fsdp import fully_shard

    ignored = {p for p in model.parameters() if type(p).__name__ == "Params4bit"}
    kwargs = {"ignored_params": ignored} if ignored else {}
    for mod in model.modules():
        if type(mod).__name__ == layer_cls:
            fully_shard(mod, **kwargs)
    fully_shard(model, **kwargs)
    return model


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def measure_rank(model, opt, version: int) -> dict:
    import torch

    out = dict.fromkeys(COLUMNS, 0)
    if version == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        for mod in model.modules():
            if isinstance(mod, FSDP) and mod._handle is not None:
                flat = mod._handle.flat_param
                item = flat.element_size()
                real = sum(i.numel_in_shard or 0 for i in flat._shard_param_infos if i.in_shard)
                out["params"] += real * item
                out["padding"] += (flat.numel() - real) * item
                if flat.grad is not None:  # the rank's sharded gradient of the whole flat parameter
                    out["grads"] += flat.grad.numel() * item
                elif flat._params is not None:
                    out["grads"] += sum(p.grad.numel() * item for p in flat._params if p.grad is not None)
    else:
        storages = {}
        for p in model.parameters():
            if type(p).__name__ == "Params4bit" or not hasattr(p, "to_local"):
                continue
            loc = p.to_local()
            out["params"] += loc.numel() * loc.element_size()
            st = loc.untyped_storage()
            storages[st.data_ptr(), st.nbytes()] = st.nbytes()
            if p.grad is not None:
                g = p.grad.to_local()
                out["grads"] += g.numel() * g.element_size()
        out["padding"] = sum(storages.values()) - out["params"]
    for p in model.parameters():
        if not hasattr(p, "to_local") and version == 2:
            out["replicated"] += p.numel() * p.element_size()
            state = getattr(p, "quant_state", None)
            seen = set()
            while state is not None:
                for t in (state.absmax, state.code, state.offset):
                    if isinstance(t, torch.Tensor) and id(t) not in seen:
                        seen.add(id(t))
                        out["quant_state"] += t.numel() * t.element_size()
                state = state.state2
    for s in opt.state.values():
        out["adamw"] += sum(_local(s[k]).numel() * _local(s[k]).element_size() for k in ("exp_avg", "exp_avg_sq"))
        out["steps"] += s["step"].numel() * s["step"].element_size()
    return out


def rank_main(rank: int, world: int, cases: list, init: str, out_dir: str) -> None:
    """One rank: every case in turn under one gloo process group."""
    import torch
    import torch.distributed as dist

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    results = []
    try:
        for arch, version, use_orig, four_bit in cases:
            model = wrap_real(build_real(arch, four_bit), arch, version, use_orig)
            opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
            torch.manual_seed(1)
            ids = torch.randint(0, BASE["vocab_size"], (2, 32))
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            results.append(measure_rank(model, opt, version))
            del model, opt
            dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))


def run_real(cases: list, world: int) -> list[list[dict]]:
    """Per case, per rank: what the rank measured."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/pg"
        mp.start_processes(rank_main, args=(world, cases, init, tmp), nprocs=world, start_method="spawn")
        per_rank = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    return [[per_rank[r][i] for r in range(world)] for i in range(len(cases))]


# -- the audit ------------------------------------------------------------------------------------

def audit_spec(case: tuple, world: int, **extra) -> dict:
    arch, version, use_orig, four_bit = case
    fsdp = {"version": version, "world_size": world, "wrap": [ARCHS[arch][1]]}
    if version == 1:
        fsdp.update(auto_wrap_policy="peft", use_orig_params=use_orig)
    if four_bit:
        fsdp["ignored_params"] = "4bit"
    s = {"model": config(arch), "dtype": "float32", "lora": dict(LORA), "fsdp": fsdp}
    if four_bit:
        s["quantization"] = dict(QUANT)
    s.update(extra)
    return s


def audit_ranks(case: tuple, world: int):
    from fsdplint.audit import run_audit, spec_from_dict

    result = run_audit(spec_from_dict(audit_spec(case, world), filename=f"{case[0]}.json"))
    result.params = [p for u in result.plan.units for p in u.params] + result.plan.ignored + result.plan.unmanaged
    plan = result.plan
    replicated = plan.ignored + plan.unmanaged
    rep_train = [p for p in replicated if p.requires_grad]

    def col(attr, r):
        return sum(getattr(u, attr)[r] for u in plan.units if getattr(u, attr))

    rows = []
    for r in range(world):
        rows.append({
            "params": col("local_param_bytes", r),
            "padding": col("param_bytes", r) - col("local_param_bytes", r),
            "grads": col("grad_bytes", r) + sum(p.storage_bytes for p in rep_train),
            "adamw": 2 * (col("trainable_bytes", r) + sum(p.storage_bytes for p in rep_train)),
            "steps": 4 * (col("trainable_tensors", r) + len(rep_train)),
            "replicated": sum(p.storage_bytes for p in replicated),
            "quant_state": sum(p.quant_state_bytes for p in result.params if p.kind == "4bit"),
        })
    # The memory lines the user sees are the worst rank's: they must be these figures.
    mem, r = result.memory, result.memory.rank
    assert mem.line("sharded parameters").bytes == rows[r]["params"]
    assert mem.line("gradients").bytes == rows[r]["grads"]
    assert mem.line("AdamW state").bytes == rows[r]["adamw"]
    return rows, result


# -- activations ------------------------------------------------------------------------------------

def measured_activation_peak(arch: str, dtype: str, seq: int, batch: int, checkpointing: bool) -> int:
    import torch
    import transformers
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoConfig

    cfg = config(arch)
    model_type, archs = cfg.pop("model_type"), cfg.pop("architectures")
    torch.manual_seed(0)
    model = getattr(transformers, archs[0])._from_config(AutoConfig.for_model(model_type, **cfg),
                                                         dtype=getattr(torch, dtype))
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(0, BASE["vocab_size"], (batch, seq))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    snap = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return sum(v for k, v in snap.items() if k != "Total" and getattr(k, "value", k) not in
               ("Parameter", "Buffer", "Gradient"))


def activation_rows(archs, seq: int, batch: int) -> list[dict]:
    from fsdplint.audit import run_audit, spec_from_dict

    rows = []
    for arch in archs:
        for dtype in ("float32", "bfloat16"):
            for ac in (False, True):
                s = {"model": config(arch), "dtype": dtype,
                     "fsdp": {"version": 2, "world_size": 2, "wrap": [ARCHS[arch][1]]},
                     "training": {"seq_len": seq, "micro_batch": batch, "activation_checkpointing": ac}}
                t = time.perf_counter()
                act = run_audit(spec_from_dict(s, filename=f"{arch}.json")).memory.activations
                audit_s = time.perf_counter() - t
                real = measured_activation_peak(arch, dtype, seq, batch, ac)
                rows.append({"arch": arch, "dtype": dtype, "ac": ac, "audit": act.bytes, "real": real,
                             "audit_s": audit_s})
    return rows


# -- report -----------------------------------------------------------------------------------------

def render(memory_rows: list[dict], act_rows: list[dict], seq: int, batch: int, elapsed: float) -> str:
    import platform

    import torch
    import transformers

    lines = [START, "## Model audit vs real gloo runs (memory per rank)", "",
             f"Generated by `python bench/audit_vs_gloo.py` ({elapsed / 60:.1f} min; torch {torch.__version__}, "
             f"transformers {transformers.__version__}, Python {platform.python_version()}). Each case: the audit "
             f"(meta device, fake process group) against the same model built for real in N gloo processes on "
             f"CPU after one forward, backward and AdamW step. Models: 2 decoder layers, hidden "
             f"{BASE['hidden_size']}, vocab {BASE['vocab_size']}, float32, LoRA r={LORA['r']} on q_proj/v_proj; "
             f"FSDP1 with peft's `fsdp_auto_wrap_policy` (device_id=cpu), FSDP2 `fully_shard` per decoder "
             f"layer and the root; 4-bit: nf4 with double quantization, uint8 storage, FSDP2 "
             f"`ignored_params` = the Params4bit. Bytes per rank, real / audit; ✓ where equal.", "",
             "| model | FSDP | N | rank | param shard | padding | gradients | AdamW exp_avg+sq | AdamW steps "
             "| replicated | quant_state | all equal |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in memory_rows:
        cells = []
        for c in COLUMNS:
            real, audit = row["real"][c], row["audit"][c]
            cells.append(f"{real:,} ✓" if real == audit else f"{real:,} / {audit:,} ✗")
        ok = all(row["real"][c] == row["audit"][c] for c in COLUMNS)
        lines.append(f"| {row['model']} | {row['fsdp']} | {row['world']} | {row['rank']} | " + " | ".join(cells)
                     + f" | {'yes' if ok else 'NO'} |")
    lines += ["", f"Activations of one training step (micro-batch {batch} × seq {seq}, no LoRA: full "
                  f"fine-tuning), the audit's estimate (model forward+backward on meta) against the peak "
                  f"torch's `MemTracker` measures in a real CPU step (peak minus parameters, buffers and "
                  f"gradients at that moment):", "",
              "| model | dtype | activation checkpointing | audit | measured | audit / measured | audit time |",
              "|---|---|---|---|---|---|---|"]
    for r in act_rows:
        lines.append(f"| {r['arch']} | {r['dtype']} | {'yes' if r['ac'] else 'no'} | {r['audit']:,} | "
                     f"{r['real']:,} | {r['audit'] / r['real']:.3f} | {r['audit_s']:.2f} s |")
    lines += ["", "Rerun: `python bench/audit_vs_gloo.py` (writes this section; the rest of the file is "
                  "bench/run.py's).", END]
    return "\n".join(lines) + "\n"


def write_section(text: str) -> None:
    old = RESULTS.read_text() if RESULTS.exists() else ""
    if START in old and END in old:
        new = old[: old.index(START)] + text + old[old.index(END) + len(END) + 1:]
    else:
        new = old.rstrip("\n") + "\n\n" + text
    RESULTS.write_text(new)


def _label(case: tuple) -> tuple[str, str]:
    arch, version, use_orig, four_bit = case
    return ("4-bit " if four_bit else "") + arch, f"FSDP{version}" + (" orig_params" if use_orig else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated architectures (llama, qwen2, mixtral)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print only, leave results.md alone")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    archs = args.only.split(",") if args.only else list(ARCHS)
    started = time.perf_counter()
    memory_rows = []
    cases = [c for c in CASES if c[0] in archs]
    for world in WORLD_SIZES:
        reals = run_real(cases, world)
        for case, real in zip(cases, reals):
            arch, version, use_orig, four_bit = case
            audit, _ = audit_ranks(case, world)
            label, fsdp = _label(case)
            for r in sorted({0, world - 1}):
                memory_rows.append({"model": label, "fsdp": fsdp, "world": world, "rank": r,
                                    "real": real[r], "audit": audit[r]})
                ok = real[r] == audit[r]
                print(f"{label:14} {fsdp:18} N={world} rank {r}: {'equal' if ok else 'DIFFERENT'} "
                      f"{real[r] if ok else (real[r], audit[r])}", flush=True)
    memory_rows.sort(key=lambda row: (CASES.index(next(c for c in CASES if _label(c) == (row["model"], row["fsdp"]))),
                                      row["world"], row["rank"]))
    act_rows = activation_rows(archs, args.seq_len, args.micro_batch)
    for r in act_rows:
        print(f"activations {r['arch']} {r['dtype']} ac={r['ac']}: audit {r['audit']:,} measured {r['real']:,} "
              f"({r['audit'] / r['real']:.3f})", flush=True)
    text = render(memory_rows, act_rows, args.seq_len, args.micro_batch, time.perf_counter() - started)
    if not args.no_write:
        write_section(text)
        print(f"wrote {RESULTS}")
    return 0 if all(r["real"] == r["audit"] for r in memory_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
