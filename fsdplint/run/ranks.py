"""Where ranks differ at load time: what each simulated rank holds when it wraps, and whether the
cluster would fill what it lacks.

Real jobs load the weights on one rank only in two ways, and both run here as on the cluster:
- the job's own rank guard (`if rank == 0: from_pretrained(...) else: with torch.device("meta"):
  from_config(...)`, accelerate's `init_empty_weights()`): `from_config` builds the same shrunk twin as
  `from_pretrained` (see `twin`), on the device the job's context gives, so the twin on the other
  ranks is on meta exactly where the job puts it;
- transformers' own cpu-RAM-efficient loading (accelerate's `fsdp_cpu_ram_efficient_loading`,
  `FSDP_CPU_RAM_EFFICIENT_LOADING=1`): on a rank where transformers' own `is_fsdp_enabled()` holds and
  `is_local_dist_rank_0()` does not, the twin is loaded by the installed transformers' real
  `from_pretrained` from a checkpoint of the twin written for it, holding the keys the real checkpoint
  holds, so whatever that release leaves on a non-zero rank (meta tensors, `torch.empty`, keys it
  does not initialize) is what the job wraps.

A tensor left without values is made visible: `to_empty()` fills what it materializes with a
marker value, and so does the load where the real one leaves memory uninitialized. At each wrap the
run records, per rank, how many parameters hold values, are on meta, or hold the marker, with the
wrap's `sync_module_states`; a broadcast under the fake process group moves no data, so a receiving
rank's marker is replaced there as the cluster's broadcast would replace it, and the sending rank
records whether what it sent held values. The parent then compares rank 0 with the other rank
(`findings`): shards that nothing fills (FSDP011).
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
import traceback

# One marker per dtype kind: exactly representable in every float dtype (2**-15), and a byte pattern for
# integer storage. A whole tensor equal to it holds nothing the job loaded or initialized.
FLOAT_MARKER = 2.0 ** -15
INT_MARKER = 90

_BUILDING = contextvars.ContextVar("fsdplint_building_twin", default=False)
RECORD: dict = {"loads": [], "wraps": [], "collectives": [], "unfilled_at_stop": None, "notes": []}
_STATE = {"fsdp1_depth": 0, "user_root": None, "rank": 0, "job": True, "channel": None, "objects": 0}
OBJECT_WAIT = 120.0  # seconds a receiving rank waits for rank 0's object


def install(rank: int, user_root: str, channel: str | None = None) -> None:
    _STATE["rank"], _STATE["user_root"], _STATE["channel"] = rank, user_root, channel
    _from_config()
    _rank_local_load()
    _to_empty_marker()
    _wrap_records()
    _collectives()


# -- what each rank builds ---------------------------------------------------------------------------

def _from_config() -> None:
    """`from_config` / `_from_config` on a real config (the job's rank guard builds the other ranks'
    model this way): the twin of the same config, so every rank holds the same shapes."""
    from transformers import PreTrainedModel

    from fsdplint.run import models, twin

    original = PreTrainedModel._from_config.__func__

    def _twin_from_config(cls, config, **kwargs):
        # Only the job's own calls: the memory audit after the stop builds the real config.
        if _BUILDING.get() or getattr(config, "_fsdplint_twin", False) or not _STATE["job"]:
            return original(cls, config, **kwargs)
        try:
            small = twin.shrink(config, models.WORLD["size"])
            small._fsdplint_twin = True
        except Exception:  # noqa: BLE001 - a config the shrink does not fit: built as the job asks
            return original(cls, config, **kwargs)
        token = _BUILDING.set(True)
        try:
            model = original(cls, small, **kwargs)
        finally:
            _BUILDING.reset(token)
        note = f"{type(model).__name__} from_config: built as the shrunk twin of its config ({twin.sizes(small)})"
        if note not in models.NOTES:
            models.NOTES.append(note)
        return model

    PreTrainedModel._from_config = classmethod(_twin_from_config)
    build = twin.build

    @functools.wraps(build)
    def building(cls, config, *args, **kwargs):
        config._fsdplint_twin = True
        token = _BUILDING.set(True)
        try:
            return build(cls, config, *args, **kwargs)
        finally:
            _BUILDING.reset(token)

    twin.build = building


def _rank_local_load() -> None:
    from fsdplint.run import models

    build = models.build

    @functools.wraps(build)
    def build_as_this_rank_loads(cls, name, original, *args, **kwargs):
        token = _BUILDING.set(True)
        try:
            model = build(cls, name, original, *args, **kwargs)
            return _as_this_rank_loads(model, cls, name, original, args, kwargs)
        finally:
            _BUILDING.reset(token)

    models.build = build_as_this_rank_loads


def _as_this_rank_loads(model, cls, name, original, args, kwargs):
    """The model this rank's real `from_pretrained` would return: the twin itself where the real load
    reads the checkpoint on this rank; else the real loader's own result on a checkpoint of the twin."""
    import torch

    try:
        from transformers import modeling_utils as mu

        efficient = bool(mu.is_fsdp_enabled())
        local_zero = bool(getattr(mu, "is_local_dist_rank_0", lambda: True)())
    except Exception:  # noqa: BLE001 - a transformers without these: loaded as on rank 0
        return model
    entry = {"name": str(name), "cpu_ram_efficient": efficient, "local_rank_0": local_zero, "how": "twin"}
    RECORD["loads"].append(entry)
    if not efficient or local_zero or any(getattr(p, "_fsdplint_meta_model", False) for p in model.parameters()):
        return model
    if getattr(model, "hf_quantizer", None) is not None:
        entry["how"] = "twin (quantized: loaded as on local rank 0)"
        RECORD["notes"].append("cpu-RAM-efficient loading of a quantized model: this rank holds the quantized "
                               "twin as local rank 0 does (the real load of a quantized model is not rerun)")
        return model
    import tempfile

    from safetensors.torch import save_file

    saved = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    keys, how = _checkpoint_keys(name, set(saved))
    entry["missing_from_checkpoint"] = sorted(set(saved) - keys)[:8]
    load_kwargs = {k: v for k, v in kwargs.items() if k not in ("device_map", "quantization_config", "config",
                                                                "load_in_4bit", "load_in_8bit", "max_memory")}
    try:
        with tempfile.TemporaryDirectory(prefix="fsdplint-twin-") as d:
            model.config.save_pretrained(d)
            save_file({k: saved[k] for k in keys}, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
            loaded = original(cls, d, *args, **load_kwargs)
    except Exception as e:  # noqa: BLE001 - the dry run's own limit: this rank keeps the twin
        RECORD["notes"].append(f"cpu-RAM-efficient loading: the real loader could not load the twin on this rank "
                               f"({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}); it holds "
                               "the twin as local rank 0 does")
        return model
    counts = {"values": 0, "meta": 0, "uninitialized": 0}
    with torch.no_grad():
        for key, t in list(loaded.state_dict(keep_vars=True).items()):
            if t.is_meta:
                counts["meta"] += 1
            elif key in keys and key in saved and t.shape == saved[key].shape and not torch.equal(
                    t.detach().to(saved[key].dtype), saved[key]):
                _fill_marker(t)  # memory the real load left uninitialized: visible as such
                counts["uninitialized"] += 1
            else:
                counts["values"] += 1
    entry.update(how=f"transformers' own loader on a checkpoint of the twin ({how})", **counts)
    RECORD["notes"].append(
        f"cpu-RAM-efficient loading (FSDP_CPU_RAM_EFFICIENT_LOADING, not local rank 0): this rank's model came "
        f"from the installed transformers' own loader, which left {counts['values']} tensors with values, "
        f"{counts['meta']} on meta, {counts['uninitialized']} uninitialized ({how})")
    for attr in ("hf_quantizer", "is_loaded_in_4bit", "is_loaded_in_8bit"):
        if hasattr(model, attr) and not hasattr(loaded, attr):
            setattr(loaded, attr, getattr(model, attr))
    # The job (and trl, peft) read the model's path back: the one it asked for, not the twin's checkpoint.
    loaded.config._name_or_path = model.config._name_or_path
    if hasattr(model, "name_or_path"):
        try:
            loaded.name_or_path = model.name_or_path
        except AttributeError:
            pass
    return loaded


def _checkpoint_keys(name, twin_keys: set) -> tuple[set, str]:
    """The twin's keys the real checkpoint holds: from its safetensors index or header (no weight is
    read). A twin key counts as missing only where the checkpoint holds nothing under its module (a
    checkpoint naming a module's tensors otherwise, which the real load converts, is not missing it)."""
    names = _checkpoint_names(str(name))
    if names is None:
        return set(twin_keys), "no checkpoint to read: every key present"
    names = {k for k in names if not _beyond_twin_layers(k, twin_keys)}
    if len(names & twin_keys) * 2 < len(twin_keys):
        return set(twin_keys), "the checkpoint names its tensors otherwise: every key present"
    other = names - twin_keys
    missing = {k for k in twin_keys - names
               if not any(n.startswith(k.rsplit(".", 1)[0] + ".") for n in other)}
    return twin_keys - missing, "the keys of the real checkpoint"


def _beyond_twin_layers(key: str, twin_keys: set) -> bool:
    import re

    m = re.search(r"\.(\d+)\.", key)
    if not m:
        return False
    prefix = key[: m.start()]
    return not any(k.startswith(f"{prefix}.{m.group(1)}.") for k in twin_keys)


def _checkpoint_names(name: str):
    paths = []
    for f in ("model.safetensors.index.json", "model.safetensors"):
        if os.path.isdir(name):
            paths.append(os.path.join(name, f))
        else:
            try:
                from huggingface_hub import try_to_load_from_cache

                p = try_to_load_from_cache(name, f)
                if isinstance(p, str):
                    paths.append(p)
            except Exception:  # noqa: BLE001
                pass
    for p in paths:
        if not os.path.isfile(p):
            continue
        try:
            if p.endswith(".json"):
                with open(p) as f:
                    return set(json.load(f).get("weight_map", {}))
            with open(p, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                return {k for k in json.loads(f.read(n)) if k != "__metadata__"}
        except (OSError, ValueError):
            continue
    return None


# -- tensors without values --------------------------------------------------------------------------

def _fill_marker(t) -> None:
    import torch

    local = getattr(t, "_local_tensor", t)
    with torch.no_grad():
        if local.is_meta or local.numel() == 0:
            return
        local.fill_(FLOAT_MARKER if local.is_floating_point() else INT_MARKER if not local.is_complex() else 0)


def _own(f):
    return getattr(f, "__func__", f)  # a classmethod's function, whatever class it is bound to


def holds_marker(t) -> bool:
    import torch

    local = getattr(t, "_local_tensor", t)
    if local.is_meta or local.numel() < 2 or local.is_complex():
        return False
    if _own(type(local).__torch_function__) not in (_own(torch.Tensor.__torch_function__),
                                                    _own(torch.nn.Parameter.__torch_function__)):
        # A tensor subclass with its own torch-function handling (bitsandbytes' packed 4-bit Params4bit):
        # comparing it runs the library's dispatch on packed storage (a native crash with bitsandbytes
        # 0.50 under the run's torch-function modes); the quantized weights are loaded by the library
        # itself, not judged here.
        return False
    with torch.no_grad():
        value = FLOAT_MARKER if local.is_floating_point() else INT_MARKER
        try:
            return bool((local == value).all())
        except Exception:  # noqa: BLE001 - a storage type without comparison (packed 4-bit): not judged
            return False


def _to_empty_marker() -> None:
    """`to_empty()` leaves memory uninitialized: on the cluster, values that nothing fills later are
    garbage. The dry run fills them with the marker, so a tensor still holding it at the step was never
    filled (by a broadcast, a state-dict load, `reset_parameters`, an init)."""
    import torch

    to_empty = torch.nn.Module.to_empty

    @functools.wraps(to_empty)
    def marked_to_empty(self, *args, **kwargs):
        recurse = kwargs.get("recurse", True)
        before = {name for name, t in _named_tensors(self, recurse) if _local(t).is_meta}
        out = to_empty(self, *args, **kwargs)
        for name, t in _named_tensors(self, recurse):
            if name in before and not _local(t).is_meta:
                _fill_marker(t)
        return out

    torch.nn.Module.to_empty = marked_to_empty


def _local(t):
    return getattr(t, "_local_tensor", t)


def _named_tensors(module, recurse: bool):
    yield from module.named_parameters(recurse=recurse)
    yield from ((n, b) for n, b in module.named_buffers(recurse=recurse) if b is not None)


# -- at the wrap ---------------------------------------------------------------------------------------

def _state_counts(module) -> dict:
    counts = {"params": 0, "values": 0, "meta": 0, "marker": 0, "examples": []}
    for name, p in module.named_parameters():
        counts["params"] += 1
        local = getattr(p, "_local_tensor", p)
        if local.is_meta:
            counts["meta"] += 1
        elif holds_marker(p):
            counts["marker"] += 1
        else:
            counts["values"] += 1
            continue
        if len(counts["examples"]) < 3:
            counts["examples"].append(_clean(name))
    return counts


def _clean(name: str) -> str:
    for part in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(part, "")
    return name


def _frame():
    from fsdplint.run import errors

    return errors.deepest_user_frame(traceback.extract_stack(), _STATE["user_root"] or os.getcwd())


def _wrap_records() -> None:
    import torch.distributed.fsdp as fsdp_pkg
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    init = FSDP.__init__

    @functools.wraps(init)
    def recorded_init(self, module, *args, **kwargs):
        outer = _STATE["fsdp1_depth"] == 0
        if outer:
            RECORD["wraps"].append({"api": "FSDP1", "sync": bool(kwargs.get("sync_module_states")),
                                    "param_init_fn": kwargs.get("param_init_fn") is not None,
                                    "at": len(RECORD["collectives"]), "frame": _frame(), **_state_counts(module)})
        _STATE["fsdp1_depth"] += 1
        try:
            init(self, module, *args, **kwargs)
        finally:
            _STATE["fsdp1_depth"] -= 1

    FSDP.__init__ = recorded_init
    shard = fsdp_pkg.fully_shard

    @functools.wraps(shard)
    def recorded_shard(module, *args, **kwargs):
        modules = module if isinstance(module, (list, tuple)) else [module]
        counts = [_state_counts(m) for m in modules]
        merged = {k: sum(c[k] for c in counts) for k in ("params", "values", "meta", "marker")}
        merged["examples"] = [e for c in counts for e in c["examples"]][:3]
        last = RECORD["wraps"][-1] if RECORD["wraps"] else None
        if last is not None and last["api"] == "fully_shard":  # one record for the job's sharding calls
            for k in ("params", "values", "meta", "marker"):
                last[k] += merged[k]
            last["examples"] = (last["examples"] + merged["examples"])[:3]
            last["at"] = len(RECORD["collectives"])
            last["frame"] = _frame() or last["frame"]
        else:
            RECORD["wraps"].append({"api": "fully_shard", "sync": False, "param_init_fn": False,
                                    "at": len(RECORD["collectives"]), "frame": _frame(), **merged})
        return shard(module, *args, **kwargs)

    for attr in ("state",):
        if hasattr(shard, attr):
            setattr(recorded_shard, attr, getattr(shard, attr))
    import importlib

    for name in ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard",
                 "torch.distributed.fsdp._fully_shard._fully_shard", "torch.distributed._composable.fsdp",
                 "torch.distributed._composable.fsdp.fully_shard"):
        try:
            mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001
            continue
        if getattr(mod, "fully_shard", None) is shard:
            mod.fully_shard = recorded_shard


# -- collectives ---------------------------------------------------------------------------------------

_COLLECTIVES = ("broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base",
                "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "barrier", "gather", "scatter",
                "all_to_all", "all_to_all_single", "broadcast_object_list", "all_gather_object", "gather_object",
                "scatter_object_list", "monitored_barrier",
                # torch >= 2.13: FSDP2's own all-gather and reduce-scatter of each group's shards.
                "all_gather_single", "reduce_scatter_single")

# torch's functional collectives (`torch.distributed._functional_collectives`): what DTensor's
# `full_tensor()` / `redistribute()` and tensor parallelism issue. Each Python entry point, by the
# `_c10d_functional` op it issues, so the two ranks' logs compare whichever entry point a caller used
# (a wrapper calling another is logged once, as the outer call).
_FUNCTIONAL = {
    "broadcast": "broadcast", "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce_coalesced",
    "all_gather_single": "all_gather_into_tensor", "all_gather_single_autograd": "all_gather_into_tensor",
    "all_gather_tensor": "all_gather_into_tensor", "all_gather_tensor_autograd": "all_gather_into_tensor",
    "all_gather_single_coalesced": "all_gather_into_tensor_coalesced",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter_single": "reduce_scatter_tensor", "reduce_scatter_single_autograd": "reduce_scatter_tensor",
    "reduce_scatter_tensor": "reduce_scatter_tensor", "reduce_scatter_tensor_autograd": "reduce_scatter_tensor",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor_coalesced",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all_single": "all_to_all_single", "all_to_all_single_autograd": "all_to_all_single",
    "permute_tensor": "all_to_all_single",
}


def _collectives() -> None:
    """Each collective the job enters (torch.distributed's Python API and its functional collectives),
    in order: what the parent compares between ranks. A broadcast this rank receives fills its marker,
    as the cluster's would; what a sending rank sends is recorded as holding values or not."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    replaced = {}
    for name in _COLLECTIVES:
        fn = getattr(c10d, name, None)
        if fn is None or getattr(fn, "_fsdplint_logged", False):
            continue
        logged = _logged(name, fn)
        replaced[id(fn)] = (fn, logged)
        setattr(c10d, name, logged)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, logged)
    try:
        import torch.distributed._functional_collectives as funcol
    except ImportError:  # a torch without them: nothing issues them
        funcol = None
    for name, op in (_FUNCTIONAL.items() if funcol is not None else ()):
        fn = getattr(funcol, name, None)
        if fn is None or getattr(fn, "_fsdplint_logged", False):
            continue
        logged = _logged("_c10d_functional." + op, fn)
        replaced[id(fn)] = (fn, logged)
        setattr(funcol, name, logged)
    _rebind(replaced)


def _rebind(replaced: dict) -> None:
    """torch modules imported before the run (the dry run imports the stack first) that bound a
    collective by name (`from torch.distributed.distributed_c10d import broadcast`, as DTensor's
    `_collective_utils` does) call the logged one too: on the cluster they enter the same collective."""
    import sys

    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not mod_name.startswith("torch.distributed"):
            continue
        for attr, value in list(vars(mod).items()):
            hit = replaced.get(id(value))
            if hit is not None and hit[0] is value:
                setattr(mod, attr, hit[1])


def _logged(name: str, fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        # A collective another one runs (broadcast_object_list's broadcasts, a functional wrapper's
        # inner call), or one the dry run's own checks issue after the stop: not the job's.
        if _STATE.get("inside") or not _STATE["job"]:
            return fn(*args, **kwargs)
        _STATE["inside"] = True
        try:
            return _call(*args, **kwargs)
        finally:
            _STATE["inside"] = False

    def _call(*args, **kwargs):
        entry = {"op": name}
        if name == "broadcast":
            tensor = args[0] if args else kwargs.get("tensor")
            src = kwargs.get("src", args[1] if len(args) > 1 else None)
            if src is None:
                src = kwargs.get("group_src", 0)
            entry["src"] = src
            rank = _STATE["rank"]
            if tensor is not None and src == rank:
                entry["sent_values"] = not (tensor.is_meta or holds_marker(tensor))
            out = fn(*args, **kwargs)
            if tensor is not None and src != rank and holds_marker(tensor):
                import torch

                with torch.no_grad():  # what the source sends arrives: no longer the marker
                    local = getattr(tensor, "_local_tensor", tensor)
                    local.copy_(torch.randn(local.shape, dtype=torch.float32).mul_(0.02).to(local.dtype)
                                if local.is_floating_point() else torch.zeros_like(local))
                entry["filled"] = True
            _append(entry)
            return out
        if name == "broadcast_object_list":
            objects = args[0] if args else kwargs.get("object_list")
            src = kwargs.get("src", args[1] if len(args) > 1 else 0)
            entry["src"] = src
            _append(entry)
            return _broadcast_objects(fn, objects, src, entry, args, kwargs)
        _append(entry)
        return fn(*args, **kwargs)

    call._fsdplint_logged = True
    return call


def _broadcast_objects(fn, objects, src, entry, args, kwargs):
    """`broadcast_object_list` from rank 0: the fake group moves no bytes (a receiving rank would
    unpickle zeros), so the simulated rank 0 hands its objects to the other simulated rank through the
    run's directory, in call order, as the cluster's broadcast would. A rank 0 that never sends them
    (it took another path) leaves the receiver with its own objects, recorded as unmatched."""
    import pickle
    import time

    channel, rank = _STATE["channel"], _STATE["rank"]
    n = _STATE["objects"]
    _STATE["objects"] += 1
    if channel is None or src != 0 or objects is None:
        return fn(*args, **kwargs)
    path = os.path.join(channel, f"objects-{n}.pkl")
    if rank == 0:
        out = fn(*args, **kwargs)
        try:
            with open(path + ".tmp", "wb") as f:
                pickle.dump(list(objects), f)
            os.replace(path + ".tmp", path)
        except Exception:  # noqa: BLE001 - an object pickle refuses is refused on the cluster too
            pass
        return out
    deadline = time.monotonic() + OBJECT_WAIT
    done = os.path.join(channel, "rank0.json")
    while not os.path.exists(path) and time.monotonic() < deadline:
        if os.path.exists(done) and not os.path.exists(path):
            break
        time.sleep(0.05)
    try:
        with open(path, "rb") as f:
            objects[:] = pickle.load(f)
        entry["received"] = True
    except (OSError, EOFError, pickle.UnpicklingError):
        entry["unmatched"] = True
    return None


def _append(entry: dict) -> None:
    log = RECORD["collectives"]
    if len(log) < 5000:
        entry["frame"] = _frame()  # where the job's own code entered it (a library's call: its caller)
        log.append(entry)


# -- at the stop ---------------------------------------------------------------------------------------

def resume_job() -> None:
    """`--until save`: the job runs on past its checked first step, so its collectives are the job's again
    (the checks at the step issue their own, which are not)."""
    _STATE["job"] = True


def at_stop(model) -> None:
    """The parameters that still hold the marker or are on meta when the job steps: nothing filled them."""
    _STATE["job"] = False
    if model is None:
        return
    unfilled = []
    for name, p in model.named_parameters():
        if getattr(p, "_fsdplint_meta_model", False):
            return  # the real-size meta model (no twin): nothing to judge
        local = getattr(p, "_local_tensor", p)
        if local.is_meta or holds_marker(p):
            unfilled.append(_clean(name))
    RECORD["unfilled_at_stop"] = {"count": len(unfilled), "examples": unfilled[:3]}


def record() -> dict:
    return RECORD


# -- the parent: ranks compared ------------------------------------------------------------------------

def findings(result) -> list:
    """FSDP011 where a rank's shards are never filled: it wrapped parameters without values (meta, or
    memory nothing initialized) and no `sync_module_states` broadcast fills them, or the rank the
    broadcast comes from holds nothing itself; FSDP401 for a collective one rank alone enters. File
    names are as the job's frames give them (the report shortens them)."""
    from fsdplint.findings import Position
    from fsdplint.runtime.codes import make_finding

    by_rank = {r.rank: (r.data.get("holds") or {}) for r in result.ranks}
    if 0 not in by_rank:
        return []
    source = by_rank[0]
    src_wraps = source.get("wraps") or []
    out = []
    for rank, rec in sorted(by_rank.items()):
        for i, w in enumerate(rec.get("wraps") or []):
            message = _judge(rank, w, rec, src_wraps[i] if i < len(src_wraps) else None, source)
            if not message:
                continue
            f = make_finding("FSDP011", message + f" [rank {rank} of {result.world_size}]")
            f.notes["ranks"] = str(rank)
            if w.get("frame"):
                path, line, text = w["frame"]
                f.filename, f.start, f.end = path, Position(line, 1), Position(line, 1)
                f.source_line = text
            out.append(f)
            break
    out.extend(_unmatched_collectives(result))
    return out


def _unmatched_collectives(result) -> list:
    """A collective one simulated rank enters and the other does not, between the start and the same
    stop point: on the cluster the rank that entered it waits for the others forever (FSDP401)."""
    from collections import Counter

    from fsdplint.findings import Position
    from fsdplint.runtime.codes import make_finding

    done = [r for r in result.ranks if not r.data.get("exception") and not r.timed_out and r.data.get("holds")]
    if getattr(result, "until", "step") == "save":
        # `--until save`: a rank that raised after entering a collective the rank that ran to the job's end
        # never enters would hang there on the cluster, before its exception: compared too.
        raised = [r for r in result.ranks if r.data.get("exception") and not r.timed_out and r.data.get("holds")]
        if raised and any(r.data.get("point") in ("end", "exit") for r in done):
            done = sorted(done + raised, key=lambda r: r.rank)
    stop = {r.rank: "raised" if r.data.get("exception") else r.data.get("point") for r in done}
    points = set(stop.values())
    if len(done) < 2 or (len(points) > 1 and not _save_or_end(points)):
        return []
    # `--until save`: a rank that ran to the job's end entered every collective it ever enters, so only
    # what a rank stopped at its save entered beyond it is unmatched (the reverse may follow the save).
    ended = {r.rank for r in done if stop[r.rank] in ("end", "exit")} if len(points) > 1 else set()
    # Where each rank stopped (all the same but at `--until save`), as the message names it.
    point_of = dict(stop) if len(points) > 1 else {r.rank: result.ranks[0].data.get("point") for r in done}
    logs = {r.rank: r.data["holds"].get("collectives") or [] for r in done}
    if any(len(log) >= 5000 for log in logs.values()):
        return []
    counts = {rank: Counter(c["op"] for c in log) for rank, log in logs.items()}
    out = []
    ranks = sorted(logs)
    for rank in ranks:
        if rank in ended:
            continue
        others = [o for o in ranks if o != rank]
        for op in counts[rank]:
            extra = counts[rank][op] - min(counts[o][op] for o in others)
            if extra <= 0:
                continue
            # The first of this rank's calls the other rank has no counterpart for.
            seen = Counter()
            entry = None
            limit = min(counts[o][op] for o in others)
            for c in logs[rank]:
                if c["op"] == op:
                    seen[op] += 1
                    if seen[op] > limit:
                        entry = c
                        break
            other = others[0]
            ended_text = f", where rank {other} ran to the job's end" if other in ended else ""
            f = make_finding("FSDP401", (
                f"rank {rank} enters {extra} more {op}() than rank {other} before "
                f"{_point_text(point_of[rank])}{ended_text} ({counts[rank][op]} against {counts[other][op]}): "
                f"on the cluster it waits in that collective for ranks that never enter it, and the job hangs "
                f"until the NCCL timeout. Run the collective on every rank (only the write under the rank "
                f"test). [rank {rank} of {result.world_size}]"))
            f.notes["ranks"] = str(rank)
            if point_of[rank] == "raised":
                f.notes["before_exception"] = "1"  # the cluster hangs here and never reaches what it raised
            frame = (entry or {}).get("frame")
            if frame:
                f.filename, f.start, f.end = frame[0], Position(frame[1], 1), Position(frame[1], 1)
                f.source_line = frame[2]
            out.append(f)
    return out


def _save_or_end(points: set) -> bool:
    return bool(points & {"save", "raised"}) and points <= {"save", "raised", "end", "exit"}


def _point_text(point) -> str:
    return {"step": "the first optimizer step", "forward": "the first training forward", "save": "its first save",
            "raised": "what it raised after its first step",
            "end": "the end of the job", "exit": "the end of the job"}.get(point, "the stop point")


def _judge(rank: int, w: dict, rec: dict, src: dict | None, source: dict) -> str:
    empty = w.get("meta", 0) + w.get("marker", 0)
    what = (f"{empty} of its {w.get('params', 0)} parameters ({', '.join(w.get('examples') or [])}) "
            f"{'are on meta' if not w.get('marker') else 'hold no loaded values (meta or uninitialized memory)'}")
    if w.get("api") == "FSDP1":
        if rank != 0 and empty and not w.get("sync"):
            fill = ("param_init_fn materializes them as uninitialized memory" if w.get("param_init_fn") else
                    "FSDP materializes them with reset_parameters(): random values, not the loaded weights")
            return (f"rank {rank} wraps a model whose weights it did not load: {what} when "
                    f"FullyShardedDataParallel is called without sync_module_states=True, so {fill}, and this "
                    "rank trains its shards from them. Pass sync_module_states=True (with device_id=) so FSDP "
                    "broadcasts rank 0's weights.")
        if rank != 0 and empty and w.get("sync") and src is not None and (src.get("meta", 0) + src.get("marker", 0)):
            return (f"sync_module_states=True broadcasts rank 0's weights to rank {rank}, which holds none "
                    f"({what}), but rank 0 holds none either: {src.get('meta', 0) + src.get('marker', 0)} of its "
                    f"{src.get('params', 0)} parameters ({', '.join(src.get('examples') or [])}) have no values "
                    "at the wrap. Load the weights on rank 0 before wrapping.")
        return ""
    # FSDP2: no sync_module_states; what fills a rank is a broadcast after the wrap (set_model_state_dict
    # with broadcast_from_rank0, accelerate's cpu-RAM-efficient prepare) or the job's own load.
    stop = rec.get("unfilled_at_stop")
    if not stop or not stop.get("count"):
        return ""
    after = (rec.get("collectives") or [])[w.get("at", 0):]
    if rank != 0 and any(c["op"] == "broadcast" for c in after):
        sent = [c for c in (source.get("collectives") or []) if c["op"] == "broadcast" and c.get("src") == 0]
        if sent and not any(c.get("sent_values", True) for c in sent):
            return (f"rank {rank}'s shards are filled by broadcasts from rank 0, but rank 0 sends no values: "
                    f"{stop['count']} parameters ({', '.join(stop['examples'])}) hold none at the first step on "
                    f"rank {rank}. Load the weights on rank 0 before broadcasting them.")
    return (f"rank {rank} reaches its first optimizer step with {stop['count']} parameters "
            f"({', '.join(stop['examples'])}) that nothing filled after fully_shard (on meta or uninitialized "
            "memory from to_empty()): it trains them from garbage. Load or broadcast the weights into every "
            "rank's shards (set_model_state_dict(..., options=StateDictOptions(full_state_dict=True, "
            "broadcast_from_rank0=True))) before the first step.")
