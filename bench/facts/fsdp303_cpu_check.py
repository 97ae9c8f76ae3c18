"""Which FSDP plans peft `target_parameters` (ParamWrapper) LoRA survives, measured on CPU (gloo).

    python bench/facts/fsdp303_cpu_check.py               # every plan, world size 1 (one process each)
    python -m torch.distributed.run --nproc_per_node 2 bench/facts/fsdp303_cpu_check.py --plan fsdp2-layer

A small Mixtral (transformers 5 fuses its experts into 3-D parameters) gets LoRA on w1/w2/w3, which
peft turns into `target_parameters`. One forward/backward under each plan is compared with the same
model without FSDP: the loss and every LoRA gradient must be equal. FSDP303 reports the plans that
fail here.
"""

from __future__ import annotations

import argparse
import copy
import os
import socket
import subprocess
import sys

PLANS = ("fsdp2-layer", "fsdp2-layer-checkpointed", "fsdp2-root", "fsdp2-experts", "fsdp2-lora-leaves", "fsdp1-layer", "fsdp1-root",
         "fsdp1-peft-policy")


def run(plan: str) -> str:
    import torch
    import torch.distributed as dist

    import peft
    from transformers import MixtralConfig, MixtralForCausalLM

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    cfg = MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=64, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    base = MixtralForCausalLM(cfg)
    x = torch.randint(0, 64, (2, 8))

    def make():
        torch.manual_seed(1)
        return peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(r=4, target_modules=["w1", "w2", "w3"],
                                                                        init_lora_weights=False))

    def step(m):
        out = m(input_ids=x, labels=x)
        out.loss.backward()
        grads = {}
        for n, p in m.named_parameters():
            if p.requires_grad and p.grad is not None:
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                n = n.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")
                grads[n] = g.detach().clone()
        return out.loss.item(), grads

    ref_loss, ref = step(make())
    m = make()
    layers = m.base_model.model.model.layers
    try:
        if plan.startswith("fsdp2"):
            from torch.distributed.fsdp import fully_shard

            if plan == "fsdp2-experts":
                for mod in list(m.modules()):
                    if type(mod).__name__ == "MixtralExperts":
                        fully_shard(mod)
            if plan == "fsdp2-lora-leaves":
                for n, mod in list(m.named_modules()):
                    if (".lora_A." in n + "." or ".lora_B." in n + ".") and isinstance(mod, torch.nn.Linear):
                        fully_shard(mod)
            if plan == "fsdp2-layer-checkpointed":  # what accelerate's fsdp_activation_checkpointing does
                from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                    apply_activation_checkpointing,
                )
                from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer

                apply_activation_checkpointing(m, check_fn=lambda mod: isinstance(mod, MixtralDecoderLayer))
                layers = [mod for mod in m.modules() if type(mod).__name__ == "CheckpointWrapper"]
            if plan != "fsdp2-root":
                for layer in layers:
                    fully_shard(layer)
            fully_shard(m)
        else:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer

            kw = {}
            if plan == "fsdp1-layer":
                kw["auto_wrap_policy"] = ModuleWrapPolicy({MixtralDecoderLayer})
            elif plan == "fsdp1-peft-policy":
                from peft.utils.other import fsdp_auto_wrap_policy

                kw["auto_wrap_policy"] = fsdp_auto_wrap_policy(m)
            m = FSDP(m, use_orig_params=True, device_id=torch.device("cpu"), **kw)
        loss, grads = step(m)
    except Exception as e:  # the failure is the measurement
        return f"{plan}: fails: {type(e).__name__}: {' '.join(str(e).split())[:160]}"
    same = loss == ref_loss and grads.keys() == ref.keys() and all(torch.equal(grads[k], ref[k]) for k in ref)
    return f"{plan}: runs; loss and {len(ref)} LoRA gradients {'equal' if same else 'DIFFER from'} no-FSDP"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", choices=PLANS, help="one plan in this process (under torch.distributed.run)")
    args = ap.parse_args()
    if args.plan:
        line = run(args.plan)
        if int(os.environ.get("RANK", "0")) == 0:
            print(line, flush=True)
        return 0
    for plan in PLANS:  # one process per plan: a failed FSDP wrap leaves the process group unusable
        env = dict(os.environ, RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        out = subprocess.run([sys.executable, __file__, "--plan", plan], env=env, capture_output=True, text=True)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith(plan)]
        print(lines[-1] if lines else f"{plan}: no result (exit {out.returncode}): {out.stderr.strip()[-200:]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
