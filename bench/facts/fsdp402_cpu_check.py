"""What `model.module.state_dict()` of an FSDP1 model holds, measured on CPU (2 gloo ranks): the evidence
behind FSDP402's FSDP1 findings.

    python bench/facts/fsdp402_cpu_check.py

accelerate's `unwrap_model` (`extract_model_from_parallel`) strips FSDP wrappers with `model = model.module`,
so `accelerator.unwrap_model(model).state_dict()` is the state_dict of the root's inner module. A tiny model
(an embedding, two blocks of two Linear layers, a head) is wrapped with FSDP1 (FULL_SHARD) with no auto-wrap
policy (one unit) and with one unit per block (`ModuleWrapPolicy`), each with use_orig_params True and
False, trained one step, and then three state dicts are compared on every rank:

- `full`: `model.state_dict()` under FSDP1's default state-dict type (never set: FULL_STATE_DICT with
  `FullStateDictConfig()`, i.e. offload_to_cpu=False, rank0_only=False);
- `unwrapped`: `model.module.state_dict()` (what accelerate's unwrap_model hands to the user);
- `rank0_only`: `model.state_dict()` under FULL_STATE_DICT with `FullStateDictConfig(rank0_only=True)`.

For `unwrapped` it prints the keys missing from the full dict, extra keys, and the keys whose tensor is
not the full tensor (a flat 1-D shard or an empty tensor); for `full` and `rank0_only` the number of
elements each rank holds (the whole model on every rank, or on rank 0 only).
"""

from __future__ import annotations

import os
import socket


def build():
    """The toy model of fsdp114_cpu_check.py (an embedding, two blocks of two linears, a head), without the
    LoRA target that script leaves in the root unit."""
    from fsdp114_cpu_check import build_classes

    Net, Block, _ = build_classes(lora_in_root=False)
    return Net, Block


def compare(full: dict, part: dict) -> str:
    missing = [k for k in full if k not in part]
    extra = [k for k in part if k not in full]
    wrong = []
    for k, v in part.items():
        ref = full.get(k)
        if ref is None:
            continue
        if v.numel() == 0:
            wrong.append(f"{k}: empty")
        elif tuple(v.shape) != tuple(ref.shape):
            wrong.append(f"{k}: shape {tuple(v.shape)} (full {tuple(ref.shape)})")
        elif not bool((v == ref).all()):
            wrong.append(f"{k}: other values")
    ok = len(full) - len(missing) - len(wrong)
    out = [f"{ok}/{len(full)} keys hold the full tensor"]
    if missing:
        out.append(f"missing {len(missing)}: {', '.join(missing)}")
    if extra:
        out.append(f"extra: {', '.join(extra)}")
    if wrong:
        out.append(f"not full {len(wrong)}: {'; '.join(wrong)}")
    return " | ".join(out)


def trained(layout: str, orig: bool):
    """A fresh model, wrapped and trained one step, and its weights before wrapping."""
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    Net, Block = build()
    torch.manual_seed(0)
    net = Net()
    reference = {k: v.detach().clone() for k, v in net.state_dict().items()}
    policy = ModuleWrapPolicy({Block}) if layout == "block" else None
    m = FSDP(net, auto_wrap_policy=policy, use_orig_params=orig, device_id=torch.device("cpu"))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.randint(0, 32, (2, 5))).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    return m, reference


def run(rank: int, layout: str, orig: bool) -> list[str]:
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    m, reference = trained(layout, orig)
    default = FSDP.get_state_dict_type(m)
    full = {k: v.detach().clone() for k, v in m.state_dict().items()}
    total = sum(v.numel() for v in reference.values())
    lines = [
        f"default type {default.state_dict_type.name} {default.state_dict_config}",
        f"full: {len(full)} keys, {sum(v.numel() for v in full.values())}/{total} elements, keys as unwrapped "
        f"model: {sorted(full) == sorted(reference)}",
    ]
    m, _ = trained(layout, orig)  # each state dict from a fresh model: one read must not disturb the next
    try:
        lines.append(f"unwrapped: {compare(full, m.module.state_dict())}")
    except Exception as e:  # noqa: BLE001 - the outcome is what is measured
        lines.append(f"unwrapped: RAISES {type(e).__name__}: {str(e).splitlines()[0][:90]}")
    m, _ = trained(layout, orig)
    # offload_to_cpu=True is left out: with CPU parameters torch 2.13 frees the gathered storage it would copy
    # ("setStorage ... out of bounds for storage of size 0"); on GPUs it is the half of the fix that saves memory.
    with FSDP.state_dict_type(m, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
        r0 = m.state_dict()
    lines.append(f"rank0_only: {len(r0)} keys, {sum(v.numel() for v in r0.values())}/{total} elements")
    return [f"rank {rank} policy={layout:5} use_orig_params={orig!s:5} {line}" for line in lines]


def worker(rank: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if rank == 0:
        print(f"torch {torch.__version__}", flush=True)
    for layout in ("none", "block"):
        for orig in (False, True):
            lines = run(rank, layout, orig)
            gathered = [None, None]
            dist.all_gather_object(gathered, lines)
            if rank == 0:
                for rank_lines in gathered:
                    print("\n".join(rank_lines), flush=True)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port,), nprocs=2)


if __name__ == "__main__":
    main()
