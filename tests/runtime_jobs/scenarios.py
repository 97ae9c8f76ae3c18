"""Runs named scenarios under torchrun; every rank writes what fsdplint.check did.

usage: torchrun --standalone --nproc-per-node 2 scenarios.py OUT_DIR NAME [NAME ...]
Each scenario builds a tiny model, calls fsdplint.check(on_error="raise") and
catches the error so the next scenario can run; OUT_DIR/rank<N>.json collects
{"<name>": {"raised", "message", "codes", "findings", "extra"}}.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny  # noqa: E402

import fsdplint  # noqa: E402


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def correct():
    model = tiny.shard(tiny.add_lora(tiny.base_model()))
    opt = torch.optim.AdamW(trainable(model), lr=1e-2)
    return model, opt, {"after": lambda: {"losses": tiny.train_steps(model, opt)}}


def after_eval_forward():
    # An eval forward leaves the root unsharded (reshard_after_forward=False): still managed.
    model, opt, _ = correct()
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 4, dtype=torch.long))
    return model, opt, {}


def lora_after_wrap():
    model = tiny.add_lora(tiny.shard(tiny.base_model()), seed=dist.get_rank())
    return model, torch.optim.AdamW(trainable(model)), {}


def forgot_root_unit():
    # Layers sharded, root not: the unfrozen final norm sits in no unit.
    model = tiny.add_lora(tiny.base_model())
    model.get_base_model().model.norm.weight.requires_grad_(True)
    tiny.shard(model, root=False)
    return model, torch.optim.AdamW(trainable(model)), {}


def ignored_trainable():
    model = tiny.add_lora(tiny.base_model())
    head = model.get_base_model().lm_head.weight
    head.requires_grad_(True)
    tiny.shard(model, root=False)
    from torch.distributed.fsdp import fully_shard

    fully_shard(model, ignored_params={head})
    return model, torch.optim.AdamW(trainable(model)), {}


def stale_optimizer():
    model = tiny.add_lora(tiny.base_model())
    opt = torch.optim.AdamW(trainable(model))  # before fully_shard replaces the params
    tiny.shard(model)
    return model, opt, {}


def diverged_hsdp():
    # HSDP: 2 replicas x 1 shard; each rank initialises LoRA with its own seed.
    mesh = init_device_mesh("cpu", (dist.get_world_size(), 1), mesh_dim_names=("replicate", "shard"))
    model = tiny.add_lora(tiny.base_model(), seed=100 + dist.get_rank())
    tiny.shard(model, mesh=mesh)
    return model, torch.optim.AdamW(trainable(model)), {}


def same_init_hsdp():
    mesh = init_device_mesh("cpu", (dist.get_world_size(), 1), mesh_dim_names=("replicate", "shard"))
    model = tiny.shard(tiny.add_lora(tiny.base_model(), seed=7), mesh=mesh)
    opt = torch.optim.AdamW(trainable(model), lr=1e-2)
    return model, opt, {"after": lambda: {"losses": tiny.train_steps(model, opt)}}


def diverged_before_wrap():
    model = tiny.add_lora(tiny.base_model(), seed=100 + dist.get_rank())
    return model, None, {}


def different_rank_configs():
    model = tiny.shard(tiny.add_lora(tiny.base_model(), r=8 if dist.get_rank() == 0 else 4))
    return model, None, {}


def mixed_dtype():
    # bf16 base, fp32 adapters (peft's autocast), plus a bf16 norm unfrozen in the same unit.
    model = tiny.add_lora(tiny.base_model(dtype=torch.bfloat16))
    for layer in model.get_base_model().model.layers:
        layer.input_layernorm.weight.requires_grad_(True)
    tiny.shard(model)

    def forward():
        try:
            ids = torch.zeros(1, 4, dtype=torch.long)
            model(input_ids=ids)
            return {"forward_error": None}
        except Exception as e:  # what torch says at the first forward
            return {"forward_error": f"{type(e).__name__}: {e}"}

    return model, None, {"after_any": forward}


def qlora_fsdp2():
    import bitsandbytes as bnb

    model = tiny.base_model()
    for layer in model.model.layers:
        old = layer.self_attn.o_proj
        new = bnb.nn.Linear4bit(old.in_features, old.out_features, bias=False, compute_dtype=torch.float32)
        layer.self_attn.o_proj = new
    model = tiny.add_lora(model)
    tiny.shard(model)
    return model, None, {}


def empty_rank_shards():
    # Only lora_A (r=1) trains: its single row lands on rank 0, rank 1 holds nothing trainable.
    model = tiny.add_lora(tiny.base_model(), r=1)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_A" in name)
    tiny.shard(model)
    return model, None, {}


def replicated_adapter_synced():
    # transformers' pattern for adapters added after sharding: broadcast + grad all-reduce hook.
    model = tiny.add_lora(tiny.shard(tiny.base_model()), seed=dist.get_rank())
    for p in trainable(model):
        dist.broadcast(p.data, src=0)
        p.register_post_accumulate_grad_hook(lambda q: dist.all_reduce(q.grad, op=dist.ReduceOp.AVG))
    return model, None, {}


def fsdp1_peft_policy():
    # FSDP1 on CPU: gloo, device_id=cpu; peft's policy gives every LoRA leaf its own unit.
    from peft.utils.other import fsdp_auto_wrap_policy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = tiny.add_lora(tiny.base_model())
    wrapped = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), device_id=torch.device("cpu"),
                   use_orig_params=False)
    opt = torch.optim.AdamW(trainable(wrapped), lr=1e-2)
    return wrapped, opt, {"after": lambda: {"losses": tiny.train_steps(wrapped, opt)}}


def fsdp1_late_lora():
    from peft import LoraConfig, inject_adapter_in_model
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    late = FSDP(tiny.base_model(), device_id=torch.device("cpu"), use_orig_params=True)
    late = inject_adapter_in_model(LoraConfig(r=8, target_modules=["q_proj", "v_proj"]), late)
    # peft matches adapter names from named_modules() (with FSDP1's `_fsdp_wrapped_module.`) against
    # named_parameters() (without it), so it freezes the new adapters too; the script then unfreezes
    # them by name, as training scripts do.
    frozen_by_peft = sum(p.requires_grad for p in late.parameters())
    for name, p in late.named_parameters():
        if "lora_" in name:
            p.requires_grad_(True)
    return late, None, {"after_any": lambda: {"trainable_after_inject": frozen_by_peft}}


SCENARIOS = {f.__name__: f for f in [
    correct, after_eval_forward, lora_after_wrap, forgot_root_unit, ignored_trainable, stale_optimizer, diverged_hsdp,
    same_init_hsdp, diverged_before_wrap, different_rank_configs, mixed_dtype, qlora_fsdp2,
    empty_rank_shards, replicated_adapter_synced, fsdp1_peft_policy, fsdp1_late_lora,
]}


def run(name):
    model, opt, hooks = SCENARIOS[name]()
    record = {"raised": False, "message": "", "codes": [], "findings": [], "extra": {}}
    started = time.perf_counter()
    try:
        found = fsdplint.check(model, opt, on_error="raise")
    except fsdplint.FSDPLintError as e:
        record.update(raised=True, message=str(e))
        found = e.findings
    record["check_ms"] = (time.perf_counter() - started) * 1000
    if not record["raised"]:
        if "after" in hooks:
            record["extra"].update(hooks["after"]())
    if "after_any" in hooks:
        record["extra"].update(hooks["after_any"]())
    record["codes"] = sorted({f.code for f in found})
    record["findings"] = [dict(f.to_json(), notes=f.notes) for f in found]
    return record


def main():
    out_dir, names = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo")
    results = {name: run(name) for name in names}
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
