"""A job that lets fsdplint.check raise: every rank must stop, none may hang.

usage: torchrun --standalone --nproc-per-node 2 uncaught.py SCENARIO
After check the script would train; a rank that got past check alone would
block forever in the first FSDP collective.
"""

import os
import sys

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scenarios  # noqa: E402
import tiny  # noqa: E402

import fsdplint  # noqa: E402

if __name__ == "__main__":
    dist.init_process_group("gloo")
    model, optimizer, _ = scenarios.SCENARIOS[sys.argv[1]]()
    fsdplint.check(model, optimizer)
    print(f"rank {dist.get_rank()} passed the check", flush=True)
    tiny.train_steps(model, optimizer)
    dist.destroy_process_group()
