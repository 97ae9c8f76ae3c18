"""What FSDP2's `clip_grad_norm_(...)` returns, measured on CPU (2 gloo ranks): the evidence behind FSDP501.

    python bench/facts/fsdp501_cpu_check.py

A tiny MLP is sharded with `fully_shard` on each layer and the root; an unsharded copy with the same
weights runs the same batch. Prints the returned norm's type and placements, `.item()` on every rank, the
unsharded norm, and `full_tensor().item()`; also the FSDP1 case (`torch.nn.utils.clip_grad_norm_` over an
FSDP1 module's sharded parameters versus `FullyShardedDataParallel.clip_grad_norm_`). Exit status 0 always:
the output is the measurement. `run()` returns it as a dict for the test suite.
"""

from __future__ import annotations

import copy
import os
import socket
import sys
import tempfile


def _worker(rank, world, port, out_dir):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    x = torch.randn(4, 8)
    ref = copy.deepcopy(base)
    ref(x).pow(2).sum().backward()
    true = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e9))

    m2 = copy.deepcopy(base)
    for layer in (m2[0], m2[2]):
        fully_shard(layer)
    fully_shard(m2)
    m2(x).pow(2).sum().backward()
    n2 = torch.nn.utils.clip_grad_norm_(m2.parameters(), 1e9)
    placements = [str(p) for p in getattr(n2, "placements", ())]
    item2 = float(n2.item())
    full2 = float(n2.full_tensor().item()) if hasattr(n2, "full_tensor") else item2
    # torchtitan's clip_grad_norm_ (utils.py): get_total_norm over the DTensor grads with foreach=True (the _foreach_norm path).
    nf = torch.nn.utils.get_total_norm([p.grad for p in m2.parameters() if p.grad is not None], foreach=True)
    foreach_placements = [str(p) for p in getattr(nf, "placements", ())]
    foreach_item = float(nf.item())

    m1 = FSDP(copy.deepcopy(base), use_orig_params=True, device_id=torch.device("cpu"))
    m1(x).pow(2).sum().backward()
    torch_fn = float(torch.nn.utils.clip_grad_norm_(m1.parameters(), 1e9))
    m1.zero_grad()
    m1(x).pow(2).sum().backward()
    fsdp_fn = float(m1.clip_grad_norm_(1e9))
    with open(os.path.join(out_dir, f"{rank}.txt"), "w") as f:
        f.write(repr(dict(true=true, fsdp2_type=type(n2).__name__, fsdp2_placements=placements,
                          fsdp2_item=item2, fsdp2_full=full2,
                          foreach_placements=foreach_placements, foreach_item=foreach_item, fsdp1_torch_fn=torch_fn, fsdp1_method=fsdp_fn)))
    dist.destroy_process_group()


def run(world: int = 2) -> dict:
    import ast

    import torch
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(world, port, out), nprocs=world, join=True)
        ranks = [ast.literal_eval(open(os.path.join(out, f"{r}.txt")).read()) for r in range(world)]
    return {"torch": torch.__version__, "ranks": ranks}


def main() -> int:
    res = run()
    print(f"torch {res['torch']}")
    for r, d in enumerate(res["ranks"]):
        same = "equal" if d["fsdp2_item"] == d["true"] else "DIFFERENT"
        print(f"rank {r}: FSDP2 norm {d['fsdp2_type']}{d['fsdp2_placements']} .item()={d['fsdp2_item']!r} "
              f"({same} to the unsharded {d['true']!r}); full_tensor().item()={d['fsdp2_full']!r}")
        print(f"rank {r}: FSDP2 get_total_norm(foreach=True) {d['foreach_placements']} "
              f".item()={d['foreach_item']!r}")
        print(f"rank {r}: FSDP1 torch.nn.utils.clip_grad_norm_={d['fsdp1_torch_fn']!r}, "
              f"FSDP.clip_grad_norm_={d['fsdp1_method']!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
