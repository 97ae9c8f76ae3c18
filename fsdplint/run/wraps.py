"""The FSDP wraps, seen as they happen: FSDP1's constructor and FSDP2's `fully_shard` are the real
ones; around them the dry run records the wrap (the stop point arms) and keeps tensors off CUDA.

FSDP1 is given what a real job gives it, a loaded CPU model: the meta model becomes fake CPU tensors
(FakeTensorMode, no memory) and the real constructor runs on them, so the flattening checks
(`Cannot flatten integer dtype tensors`, uniform dtype / requires_grad) run on the real parameters.
"""

from __future__ import annotations

import functools

from fsdplint.run import sentinel


def install() -> None:
    import torch
    import torch.distributed.fsdp as fsdp_pkg
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    init = FSDP.__init__

    @functools.wraps(init)
    def fsdp1_init(self, module, *args, **kwargs):
        from torch._subclasses.fake_tensor import FakeTensorMode

        if "device_id" in kwargs and kwargs["device_id"] is not None:
            kwargs["device_id"] = torch.device("cpu")
        if kwargs.get("sync_module_states"):
            # FSDP1 refuses CPU tensors for the broadcast, and under the fake group it moves no data.
            kwargs["sync_module_states"] = False
            sentinel.PROGRESS.notes.add("sync_module_states=True: the broadcast from rank 0 was skipped "
                                        "(no data to send in the dry run)")
        fake = any(p.is_meta for p in module.parameters())
        if fake:  # a param_init_fn (accelerate sets one) is then not needed: nothing is left on meta
            # What a real job hands FSDP1 is a loaded CPU model: fake CPU tensors stand for it.
            with FakeTensorMode(allow_non_fake_inputs=True):
                module.to_empty(device="cpu")
                init(self, module, *args, **kwargs)
        else:
            init(self, module, *args, **kwargs)
        sentinel.note_wrap(self)

    FSDP.__init__ = fsdp1_init

    shard = fsdp_pkg.fully_shard

    @functools.wraps(shard)
    def fully_shard(module, *args, **kwargs):
        out = shard(module, *args, **kwargs)
        sentinel.note_wrap(module if not isinstance(module, (list, tuple)) else module[0])
        return out

    for attr in ("state",):  # `fully_shard.state(module)`, as contract() provides
        if hasattr(shard, attr):
            setattr(fully_shard, attr, getattr(shard, attr))
    fsdp_pkg.fully_shard = fully_shard
    _accelerate_broadcast()
    import importlib

    for name in ("torch.distributed.fsdp._fully_shard", "torch.distributed.fsdp._fully_shard._fully_shard",
                 "torch.distributed._composable.fsdp", "torch.distributed._composable.fsdp.fully_shard"):
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        if getattr(mod, "fully_shard", None) is shard:
            mod.fully_shard = fully_shard


def _accelerate_broadcast() -> None:
    """accelerate's FSDP2 prepare with `fsdp_cpu_ram_efficient_loading` copies rank 0's full state dict
    into the shards and broadcasts it; the dry run has no weights to send, so that one step is skipped
    (and said so), as FSDP1's `sync_module_states` broadcast is."""
    try:
        from accelerate.utils import fsdp_utils
    except Exception:  # accelerate not installed: the job's own import reports it
        return
    load = getattr(fsdp_utils, "fsdp2_load_full_state_dict", None)
    if load is None:
        return

    @functools.wraps(load)
    def skipped(accelerator, model, full_sd, *args, **kwargs):
        sentinel.PROGRESS.notes.add("fsdp_cpu_ram_efficient_loading: rank 0's broadcast of the full state dict "
                                    "was skipped (no weights in the dry run)")
        return model

    fsdp_utils.fsdp2_load_full_state_dict = skipped
