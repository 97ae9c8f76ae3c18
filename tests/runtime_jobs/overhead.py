"""Measures what fsdplint.check costs inside a 2-rank FSDP2 job (not run by the tests).

usage: torchrun --standalone --nproc-per-node 2 overhead.py [hidden layers]
Prints, on rank 0, the median over 20 calls of the whole check and of its local
(communication-free) part, for the tiny test model or a larger Llama-style one.
"""

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny  # noqa: E402

import fsdplint  # noqa: E402
from fsdplint.runtime import consistency, local_checks, units  # noqa: E402


def median_ms(fn, repeat=20):
    times = []
    for _ in range(repeat):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def local_part(model, opt):
    scan = units.scan_model(model)
    local_checks.local_findings(scan, opt)
    consistency.digest(consistency.spec_lines(scan))
    consistency.replica_sets(scan)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    if len(sys.argv) == 3:
        tiny.CONFIG.update(hidden_size=int(sys.argv[1]), intermediate_size=4 * int(sys.argv[1]),
                           num_hidden_layers=int(sys.argv[2]), vocab_size=32000)
    model = tiny.shard(tiny.add_lora(tiny.base_model()))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    fsdplint.check(model, opt)  # warm-up
    total = median_ms(lambda: fsdplint.check(model, opt))
    local = median_ms(lambda: local_part(model, opt))
    step = median_ms(lambda: tiny.train_steps(model, opt, steps=1), repeat=5)
    if dist.get_rank() == 0:
        n = sum(p.numel() for p in model.parameters())  # DTensor.numel() is the global size
        print(f"params={n / 1e6:.1f}M tensors={len(list(model.parameters()))} check={total:.1f} ms "
              f"(local part {local:.1f} ms) one train step={step:.0f} ms")
    dist.destroy_process_group()
