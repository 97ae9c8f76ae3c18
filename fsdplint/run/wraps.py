"""The FSDP wraps, seen as they happen: FSDP1's constructor and FSDP2's `fully_shard` are the real
ones; around them the dry run records the wrap (the stop point arms) and keeps tensors off CUDA.

Both compute on the CPU: FSDP1 gets `device_id=cpu` (the job's `device_id=local_rank` names a GPU the
CPU stands for), FSDP2 a CPU mesh of the job's mesh shape. The model is normally the shrunk twin
(real CPU tensors), so the wrap, its lazy init at the first forward, the reduce-scatter in backward
and the step run for real under the fake process group (collectives complete without moving data).
Only a model left on meta (no twin could be built) takes the old path: FSDP1 then wraps a fake-tensor
copy (FakeTensorMode, no memory), so its flattening checks still run on the real parameters.
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

        # Without a device_id FSDP1 would compute on torch.cuda.current_device() and open CUDA streams.
        kwargs["device_id"] = torch.device("cpu")
        fake = any(getattr(p, "_fsdplint_meta_model", False) for p in module.parameters())
        if kwargs.get("sync_module_states"):
            # FSDP1 refuses CPU modules for this broadcast ("requires them to be on GPU"), and under the
            # fake group it would move no data: skipped, and said so. Each rank keeps its own values;
            # its code path (what it built, how it was wrapped) is what the run checks.
            kwargs["sync_module_states"] = False
            sentinel.PROGRESS.notes.add("sync_module_states=True: the broadcast from rank 0 was skipped "
                                        "(FSDP1 broadcasts only GPU modules; no data to send in the dry run)")
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
        if kwargs.get("mesh") is not None:
            kwargs["mesh"] = cpu_mesh(kwargs["mesh"])
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


def cpu_mesh(mesh):
    """The same mesh (shape, dim names) on the CPU: FSDP2 picks its compute device from the mesh."""
    if getattr(mesh, "device_type", "cpu") == "cpu":
        return mesh
    from torch.distributed.device_mesh import DeviceMesh

    cached = _MESHES.get(id(mesh))
    if cached is None:
        cached = DeviceMesh("cpu", mesh.mesh, mesh_dim_names=mesh.mesh_dim_names)
        _MESHES[id(mesh)] = cached
    return cached


_MESHES: dict = {}


def _accelerate_broadcast() -> None:
    """accelerate's FSDP2 prepare with `fsdp_cpu_ram_efficient_loading` moves the model to meta, shards
    it, then copies rank 0's full state dict into the shards with broadcasts. With the twin that runs
    for real (the fake group completes the broadcasts without moving data); only a real-size meta
    model, which has no values to send, skips it. Either way the report says which."""
    try:
        from accelerate.utils import fsdp_utils
    except Exception:  # accelerate not installed: the job's own import reports it
        return
    load = getattr(fsdp_utils, "fsdp2_load_full_state_dict", None)
    if load is None:
        return

    @functools.wraps(load)
    def skipped(accelerator, model, full_sd, *args, **kwargs):
        from fsdplint.run import models

        # Only the main process reads `full_sd` (the others receive rank 0's tensors), so only there do
        # its tensors say whether there is anything to send; another rank skips exactly when rank 0
        # does: when this run could build no twin (the same config on every rank), not when its own
        # unread copy holds meta tensors.
        if getattr(accelerator, "is_main_process", True):
            nothing_to_send = any(getattr(t, "is_meta", False) for t in (full_sd or {}).values())
        else:
            nothing_to_send = bool(models.META_BUILT)
        if nothing_to_send:
            # The real-size meta model (no twin): there are no values to load.
            sentinel.PROGRESS.notes.add("fsdp_cpu_ram_efficient_loading: rank 0's broadcast of the full state "
                                        "dict was skipped (no weights in the dry run)")
            return model
        sentinel.PROGRESS.notes.add("fsdp_cpu_ram_efficient_loading: rank 0's broadcast of the full state dict "
                                    "ran under the fake process group (no data moved)")
        return load(accelerator, model, full_sd, *args, **kwargs)

    fsdp_utils.fsdp2_load_full_state_dict = skipped
