"""The fake N-GPU node: interposed at library boundaries, never in the user's source.

- `torch.distributed.init_process_group(...)` → the `fake` backend (torch.testing's FakeStore) with
  the rank and world size the launcher's environment gives.
- `torch.cuda.is_available/device_count/current_device/set_device/...` answer as on a node of
  LOCAL_WORLD_SIZE GPUs of `--gpu-memory` each; tensors and modules sent to "cuda" stay on meta (a
  meta tensor) or on the CPU (real data: token ids, masks), so the job's device logic runs unchanged.
- The library stack (transformers, peft, bitsandbytes, accelerate) is imported before the CUDA
  answers change, so none of them picks a CUDA kernel at import time.
"""

from __future__ import annotations

import collections
import os

GIB = 1024 ** 3


def import_stack() -> None:
    import torch  # noqa: F401

    # Only what picks a device backend at import time (bitsandbytes does); the rest the job imports.
    for name in ("transformers", "peft", "accelerate", "bitsandbytes"):
        try:
            __import__(name)
        except Exception:  # not installed: the job's own import reports it, at its line
            pass


def install(world_size: int, rank: int, local_world_size: int, gpu_memory: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    init = dist.init_process_group

    def fake_init(*args, **kwargs):
        if dist.is_initialized():
            return None
        kwargs = {k: v for k, v in kwargs.items() if k in ("timeout", "pg_options", "device_id")}
        kwargs.pop("device_id", None)
        return init("fake", store=FakeStore(), rank=rank, world_size=world_size, **kwargs)

    dist.init_process_group = fake_init
    if hasattr(dist, "distributed_c10d"):
        dist.distributed_c10d.init_process_group = fake_init
    _cuda(torch, local_world_size, int(os.environ.get("LOCAL_RANK", rank % max(local_world_size, 1))), gpu_memory)


class _Props:
    def __init__(self, memory: int, index: int):
        self.name = "fsdplint dry-run GPU"
        self.total_memory = memory
        self.major, self.minor = 9, 0
        self.multi_processor_count = 132
        self.index = index


def _cuda(torch, count: int, local_rank: int, memory: int) -> None:
    cuda = torch.cuda
    state = {"device": local_rank}

    def set_device(d):
        state["device"] = d.index if isinstance(d, torch.device) else int(d) if not isinstance(d, str) else \
            int(d.split(":")[1]) if ":" in d else 0

    answers = {
        "is_available": lambda: True,
        "device_count": lambda: count,
        "current_device": lambda: state["device"],
        "set_device": set_device,
        "synchronize": lambda *a, **k: None,
        "empty_cache": lambda: None,
        "is_bf16_supported": lambda *a, **k: True,
        "get_device_properties": lambda d=None: _Props(memory, state["device"]),
        "get_device_name": lambda d=None: "fsdplint dry-run GPU",
        "get_device_capability": lambda d=None: (9, 0),
        "mem_get_info": lambda d=None: (memory, memory),
        "memory_allocated": lambda d=None: 0,
        "max_memory_allocated": lambda d=None: 0,
        "memory_reserved": lambda d=None: 0,
        "reset_peak_memory_stats": lambda d=None: None,
        "reset_max_memory_allocated": lambda d=None: None,
        "reset_max_memory_cached": lambda d=None: None,
        "reset_accumulated_memory_stats": lambda d=None: None,
        "max_memory_reserved": lambda d=None: 0,
        "max_memory_cached": lambda d=None: 0,
        "memory_cached": lambda d=None: 0,
        "memory_stats": lambda d=None: collections.defaultdict(int),
        "memory_summary": lambda *a, **k: "",
        "manual_seed": lambda s: None,
        "manual_seed_all": lambda s: None,
        "is_initialized": lambda: True,
    }
    # torch.cuda.memory's functions call one another through that module's names
    # (`reset_max_memory_allocated` -> `reset_peak_memory_stats`): both namespaces answer.
    memory = getattr(cuda, "memory", None)
    for name, fn in answers.items():
        setattr(cuda, name, fn)
        if memory is not None and hasattr(memory, name):
            setattr(memory, name, fn)
    # torch's device-generic API (accelerate's FSDP1 prepare asks it for the device).
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        generic = {"is_available": lambda *a, **k: True, "current_accelerator": lambda *a, **k: torch.device("cuda"),
                   "device_count": lambda: count, "current_device_index": lambda: state["device"],
                   "current_device_idx": lambda: state["device"], "set_device_index": set_device,
                   "set_device_idx": set_device, "synchronize": lambda *a, **k: None}
        for name, fn in generic.items():
            if hasattr(acc, name):
                setattr(acc, name, fn)
    cpu_stream = getattr(getattr(torch, "cpu", None), "Stream", None)
    if cpu_stream is not None and not hasattr(cpu_stream, "synchronize"):
        # FSDP1 computing on the CPU with offload_params waits on its device's current stream after
        # backward; CPU work is synchronous, so there is nothing to wait for.
        cpu_stream.synchronize = lambda self: None
    _tensor_moves(torch)
    _factories(torch)


def _factories(torch) -> None:
    """Tensors made on "cuda" by a factory (`torch.tensor(0.0, device=args.device)`, `torch.zeros(...,
    device="cuda")`, as Trainer's loop does) are made on the CPU: one torch-function mode, entered for
    the whole run, rewrites the `device` argument of every call, so no list of factories is kept."""
    from torch.overrides import TorchFunctionMode

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.Tensor.pin_memory:  # DataLoader(pin_memory=True): no GPU to pin for
                return args[0]
            if "device" in kwargs and _is_cuda(kwargs["device"]) and not isinstance(kwargs["device"], int):
                kwargs = {**kwargs, "device": torch.device("cpu")}
            return func(*args, **kwargs)

    CudaOnCpu().__enter__()


def _is_cuda(d) -> bool:
    return (isinstance(d, str) and d.startswith("cuda")) or (hasattr(d, "type") and getattr(d, "type", None) == "cuda") \
        or (isinstance(d, int) and not isinstance(d, bool))


def _target(t, torch):
    """Where a tensor sent to "cuda" goes: meta stays meta, data stays on the CPU."""
    return torch.device("meta") if t.is_meta else torch.device("cpu")


def _tensor_moves(torch) -> None:
    to = torch.Tensor.to

    def moved_to(self, *args, **kwargs):
        if args and _is_cuda(args[0]):
            args = (_target(self, torch), *args[1:])
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = _target(self, torch)
        return to(self, *args, **kwargs)

    torch.Tensor.to = moved_to
    torch.Tensor.cuda = lambda self, *a, **k: to(self, _target(self, torch))
    module_to = torch.nn.Module.to

    def module_moved_to(self, *args, **kwargs):
        if args and _is_cuda(args[0]):
            args = (torch.device("meta") if _on_meta(self) else torch.device("cpu"), *args[1:])
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = torch.device("meta") if _on_meta(self) else torch.device("cpu")
        return module_to(self, *args, **kwargs)

    torch.nn.Module.to = module_moved_to
    to_empty = torch.nn.Module.to_empty

    def module_to_empty(self, *args, device=None, **kwargs):
        # `model.to_empty(device="cuda")` after building on meta: the CPU holds what the GPU would.
        if args:
            device, args = args[0], args[1:]
        return to_empty(self, *args, device="cpu" if _is_cuda(device) else device, **kwargs)

    torch.nn.Module.to_empty = module_to_empty
    _meshes(torch)
    torch.nn.Module.cuda = lambda self, *a, **k: module_to(self, torch.device("meta") if _on_meta(self) else "cpu")


def _meshes(torch) -> None:
    """`init_device_mesh("cuda", ...)`: a CPU mesh of the same shape over the fake group, so FSDP2
    computes on the CPU (a CUDA mesh would make it open CUDA streams). Meshes built by code that
    imported the function before the run are converted at `fully_shard` (see wraps.cpu_mesh)."""
    import torch.distributed.device_mesh as dm

    build = dm.init_device_mesh

    def init_device_mesh(device_type, *args, **kwargs):
        return build("cpu" if str(device_type).startswith("cuda") else device_type, *args, **kwargs)

    dm.init_device_mesh = init_device_mesh
    if hasattr(torch.distributed, "init_device_mesh"):
        torch.distributed.init_device_mesh = init_device_mesh


def _on_meta(module) -> bool:
    return any(p.is_meta for p in module.parameters())
