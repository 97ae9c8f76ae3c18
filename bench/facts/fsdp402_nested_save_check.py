"""`save_pretrained` of a peft model wrapped with FSDP1 in nested units, measured on CPU (2 gloo ranks): the
evidence behind FSDP402's nested-unit case.

    python bench/facts/fsdp402_nested_save_check.py

A tiny model (an embedding, two blocks of two Linear layers, a head) gets LoRA on `q`/`v` and is wrapped with
FSDP1 (FULL_SHARD, the default FULL_STATE_DICT, no state_dict_type set) under three layouts: one unit (no
policy), one unit per block (`ModuleWrapPolicy`) and peft's `fsdp_auto_wrap_policy` shape (every module with
trainable parameters its own unit, plus the blocks), with use_orig_params True and False. After one
training step every rank calls `model.save_pretrained(dir_of_rank)` (the FSDP wrapper forwards it to the
PeftModel) and the written adapter is read back: tensor count, and whether each tensor equals the adapter
weights gathered with `FSDP.summon_full_params`. `run()` returns the results for the test suite.
"""

from __future__ import annotations

import ast
import functools
import os
import socket
import sys
import tempfile

LAYOUTS = ("one", "block", "peftlike")


def _worker(rank, world, port, out_dir):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, _or_policy, lambda_auto_wrap_policy

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.v = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            return x + self.v(torch.relu(self.q(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 16)
            self.layers = nn.ModuleList([Block(), Block()])
            self.head = nn.Linear(16, 32)

        def forward(self, ids):
            h = self.emb(ids)
            for b in self.layers:
                h = b(h)
            return self.head(h)

    def leaf(m):  # peft's fsdp_auto_wrap_policy: a module whose own parameters all train
        ps = list(m.parameters(recurse=False))
        return len(list(m.named_children())) == 0 and bool(ps) and all(p.requires_grad for p in ps)

    results = {}
    for layout in LAYOUTS:
        for orig in (True, False):
            torch.manual_seed(0)
            model = get_peft_model(Net(), LoraConfig(r=4, target_modules=["q", "v"], init_lora_weights=False))
            policy = {"one": None, "block": ModuleWrapPolicy({Block}),
                      "peftlike": functools.partial(_or_policy, policies=[
                          functools.partial(lambda_auto_wrap_policy, lambda_fn=leaf), ModuleWrapPolicy({Block})])}[layout]
            name = f"{layout}/use_orig_params={orig}"
            try:
                m = FSDP(model, auto_wrap_policy=policy, use_orig_params=orig, device_id=torch.device("cpu"))
                opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1)
                m(torch.randint(0, 32, (2, 8))).sum().backward()
                opt.step()
                d = os.path.join(out_dir, f"{layout}-{orig}-{rank}")
                m.save_pretrained(d)
                saved = load_file(os.path.join(d, "adapter_model.safetensors"))
                with FSDP.summon_full_params(m):
                    want = {k: v.detach().clone() for k, v in m.named_parameters() if "lora_" in k}
                whole = sum(1 for v in saved.values() if any(v.shape == w.shape and torch.equal(v, w)
                                                             for w in want.values()))
                results[name] = f"{len(saved)} tensors written, {whole} of {len(want)} adapter weights whole"
            except Exception as e:  # the measurement is the error text
                results[name] = f"RAISES {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    with open(os.path.join(out_dir, f"{rank}.txt"), "w") as f:
        f.write(repr(results))
    dist.destroy_process_group()


def run(world: int = 2) -> dict:
    import torch
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(world, port, out), nprocs=world, join=True)
        ranks = [ast.literal_eval(open(os.path.join(out, f"{r}.txt")).read()) for r in range(world)]
    import peft

    return {"torch": torch.__version__, "peft": peft.__version__, "ranks": ranks}


def main() -> int:
    res = run()
    print(f"torch {res['torch']}, peft {res['peft']}")
    for r, d in enumerate(res["ranks"]):
        for name, what in d.items():
            print(f"rank {r} {name}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
