"""Which peft adapter toggles survive FSDP1, measured on CPU (2 gloo ranks): the evidence behind FSDP114.

    python bench/facts/fsdp114_cpu_check.py                       # every scenario, every layout
    python bench/facts/fsdp114_cpu_check.py fwd:after-pass --layouts block --lora-in-root no
    PYTHONPATH=/path/to/peft-0.15.2 python bench/facts/fsdp114_cpu_check.py   # another peft release

A tiny model (an embedding, two blocks of two Linear layers, an optional LoRA target in the root, a head)
gets LoRA on `q`/`v` and is wrapped with FSDP1 (FULL_SHARD) under three layouts: one unit (no policy), one
unit per block (`ModuleWrapPolicy`), and peft's `fsdp_auto_wrap_policy` shape (trainable leaf modules and
blocks), each with use_orig_params True and False. Every scenario runs three forward/backward steps and
prints `ok`, `RAISES <error>` or `init: <error>` (FSDP refused to wrap).

Scenarios: toggles in the training step (`loop-disable`: a `disable_adapter()` reference pass under
no_grad; `dpo`: set_adapter to a frozen reference adapter and back under no_grad, trl's trick), a call of
the inner module that bypasses the wrapper (`inner-call`), and toggles inside the wrapped forward
(`fwd:*`).
"""

from __future__ import annotations

import argparse
import functools
import os
import socket

LAYOUTS = ("one", "block", "peftlike")
SCENARIOS = ("loop-disable", "dpo", "inner-call", "fwd:disable", "fwd:disable-grad", "fwd:layers",
             "fwd:after-pass", "fwd:restored", "fwd:userloop", "fwd:two-adapters")


def build_classes(lora_in_root: bool):
    import torch
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(16, 16)
            self.v = nn.Linear(16, 16)

        def forward(self, x):
            return x + self.v(torch.relu(self.q(x)))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 16)
            self.layers = nn.ModuleList([Block(), Block()])
            self.q = nn.Linear(16, 16) if lora_in_root else None  # a LoRA target left in the root unit
            self.head = nn.Linear(16, 32)

        def forward(self, ids):
            h = self.emb(ids)
            for b in self.layers:
                h = b(h)
            return self.head(self.q(h) if self.q is not None else h)

    class Outer(nn.Module):
        """The wrapped module; its forward toggles the peft model it holds."""

        def __init__(self, lm, mode):
            super().__init__()
            self.lm, self.mode = lm, mode

        def forward(self, ids):
            m = self.mode
            if m == "disable":  # a reference pass under no_grad inside forward
                with torch.no_grad(), self.lm.disable_adapter():
                    ref = self.lm(ids)
            elif m == "disable-grad":  # the same with gradients (peft's own FSDP test does this)
                with self.lm.disable_adapter():
                    ref = self.lm(ids)
            elif m == "layers":  # enable, pass, disable, pass
                self.lm.set_adapter("default")
                self.lm.enable_adapter_layers()
                ref = self.lm(ids)
                self.lm.disable_adapter_layers()
            elif m == "after-pass":  # pass, then disable, left disabled
                out = self.lm(ids)
                self.lm.disable_adapter_layers()
                return out
            elif m == "restored":  # pass, disable, pass, enable again
                out = self.lm(ids)
                self.lm.disable_adapter_layers()
                base = self.lm(ids)
                self.lm.enable_adapter_layers()
                return out + 0 * base
            elif m == "two-adapters":  # peft#2977's encoder/decoder forward
                self.lm.set_adapter("ref")
                self.lm.enable_adapter_layers()
                for n, p in self.lm.named_parameters():
                    if ".ref." in n:
                        p.requires_grad = False
                ref = self.lm(ids)
                self.lm.disable_adapter_layers()
                return self.lm(ids) + 0 * ref.sum()
            elif m == "userloop":  # the user's flip, once, before the passes
                for n, p in self.lm.named_parameters():
                    if "lora_A" in n:
                        p.requires_grad = False
                ref = self.lm(ids)
            return self.lm(ids) + 0 * ref.sum()

    return Net, Block, Outer


def run(scenario: str, layout: str, orig: bool, lora_in_root: bool) -> str:
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, _or_policy, lambda_auto_wrap_policy

    Net, Block, Outer = build_classes(lora_in_root)
    torch.manual_seed(0)
    ids = torch.randint(0, 32, (2, 5))
    try:
        lm = get_peft_model(Net(), LoraConfig(r=4, lora_alpha=8, target_modules=["q", "v"], init_lora_weights=False))
        if scenario in ("dpo", "fwd:two-adapters"):
            lm.add_adapter("ref", LoraConfig(r=4, lora_alpha=8, target_modules=["q", "v"], init_lora_weights=False))
            lm.set_adapter("default")
            for n, p in lm.named_parameters():
                if ".ref." in n:
                    p.requires_grad = False
        root = Outer(lm, scenario.split(":", 1)[1]) if scenario.startswith("fwd:") else lm

        def trainable_leaf(module):
            w = getattr(module, "weight", None)
            return not list(module.children()) and w is not None and w.requires_grad

        policy = {
            "one": None,
            "block": ModuleWrapPolicy({Block}),
            "peftlike": functools.partial(_or_policy, policies=[
                functools.partial(lambda_auto_wrap_policy, lambda_fn=trainable_leaf), ModuleWrapPolicy({Block})]),
        }[layout]
        m = FSDP(root, auto_wrap_policy=policy, use_orig_params=orig, device_id=torch.device("cpu"))
    except Exception as e:  # noqa: BLE001 - the outcome is what is measured
        return f"init: {type(e).__name__}: {str(e).splitlines()[0][:70]}"
    note = ""
    try:
        for _ in range(3):
            if scenario == "loop-disable":
                with torch.no_grad(), m.module.disable_adapter():
                    ref = m(ids)
                with torch.no_grad():
                    note = f" (reference differs from policy: {not torch.allclose(ref, m(ids))})"
            elif scenario == "dpo":
                with torch.no_grad():
                    m.set_adapter("ref")
                    ref = m(ids)
                    m.set_adapter("default")
                    note = f" (reference differs from policy: {not torch.allclose(ref, m(ids))})"
            elif scenario == "inner-call":
                with torch.no_grad(), m.module.disable_adapter():
                    m.module(ids)
            m(ids).float().pow(2).mean().backward()
    except Exception as e:  # noqa: BLE001
        return f"RAISES {type(e).__name__}: {str(e).splitlines()[0][:70]}"
    return "ok" + note


def worker(rank: int, port: int, scenarios, layouts, lora_in_root: bool) -> None:
    import peft
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for scenario in scenarios:
        for layout in layouts:
            for orig in (True, False):
                r = run(scenario, layout, orig, lora_in_root)
                if rank == 0:
                    print(f"peft {peft.__version__:8} {scenario:17} {layout:9} use_orig_params={orig!s:5} -> {r}",
                          flush=True)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenarios", nargs="?", default=",".join(SCENARIOS))
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--lora-in-root", choices=("yes", "no"), default="yes")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, args.scenarios.split(","), args.layouts.split(","), args.lora_in_root == "yes"),
             nprocs=2)


if __name__ == "__main__":
    main()
