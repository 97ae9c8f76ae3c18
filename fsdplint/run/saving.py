"""`fsdplint run --until save`: past the first optimizer step to the job's first save, and what it wrote.

How the job gets there with its own save code: after the first optimizer step (its checks run as at
`--until step`), every data loader the job iterates is cut (its iterators end), so a training loop —
the job's own, the Trainer's, accelerate's — finishes its epochs at once without more forward passes,
and the job goes on to its first save: a `save_steps` checkpoint the Trainer takes right after that
step, an end-of-epoch or end-of-training save, `save_pretrained`, `torch.save`, `save_state`. The first
such call after the step that writes weights (or a Trainer / accelerate model save) is the save point:
it runs whole, the real state-dict gathering and collectives included, and the rank stops when it
returns. A rank that never calls one (rank 0 alone writes) runs on to the job's end.

Nothing is written where the job asks: every path the libraries' save functions are given (and the
Trainer's `output_dir` during its saves) is sent under a directory of the run's own, which the run
deletes. What the save functions were given is judged on each rank: an adapter file that holds no
tensor or only empty ones, tensors smaller than the model's own (one rank's shard), and sharded
objects (DTensor, ShardedTensor) written to a path every rank shares (FSDP402); a Trainer
`save_model()` that writes no weights at all (FSDP404). A collective only one rank enters on the way
is FSDP401 (see `ranks`).
"""

from __future__ import annotations

import functools
import os
import sys
import traceback

_STATE = {"root": None, "rank": 0, "depth": 0, "stepped": False, "cut": False, "empty_iters": 0, "n": 0,
          "call": None, "payloads": None, "model_level": False}
SAVES: list = []  # what this rank's save point wrote (see `_judge`)
SPIN_LIMIT = 1000  # data-loader iterations that yield nothing before the run stops waiting for a save

# Calls that save the model itself: the save point even when they write no tensor.
_MODEL_LEVEL = {"Trainer.save_model", "Trainer._save_checkpoint", "Accelerator.save_state", "Accelerator.save_model",
                "PeftModel.save_pretrained", "PreTrainedModel.save_pretrained"}


def install(rank: int, root: str) -> None:
    _STATE["rank"], _STATE["root"] = rank, root
    os.makedirs(root, exist_ok=True)
    _real_steps()
    _offload_copies()
    _cut_data_loaders()
    _writes()
    _save_calls()


def after_first_step() -> None:
    _STATE["stepped"] = True
    _STATE["cut"] = True


def stepped() -> bool:
    return _STATE["stepped"]


def _real_steps() -> None:
    """The steps now run: the optimizer's check for a CUDA graph being captured asks the CPU, which the
    dry run presents as a GPU, for a CUDA stream; no graph is captured here, so there is none to check."""
    import torch

    for name in ("_accelerator_graph_capture_health_check", "_cuda_graph_capture_health_check"):
        if hasattr(torch.optim.Optimizer, name):
            setattr(torch.optim.Optimizer, name, lambda self: None)


def _offload_copies() -> None:
    """FSDP1's `offload_to_cpu=True` (FullStateDictConfig, summon_full_params) moves the gathered flat
    parameter to the CPU and frees the device copy: on a GPU `.to("cpu")` is a copy, but the dry run's FSDP1
    already computes on the CPU, where `.to("cpu")` returns the same storage, which FSDP then frees (every
    tensor of the state dict would point at freed memory). The move is made the copy it is on a GPU."""
    try:
        from torch.distributed.fsdp._flat_param import FlatParamHandle
    except ImportError:
        return
    import torch

    move = FlatParamHandle.flat_param_to

    @functools.wraps(move)
    def copying_move(self, *args, **kwargs):
        target = args[0] if args else kwargs.get("device")
        if target is not None and torch.device(target).type == "cpu" and self.flat_param.device.type == "cpu":
            kwargs["copy"] = True
        return move(self, *args, **kwargs)

    FlatParamHandle.flat_param_to = copying_move


# -- the job runs on quickly -------------------------------------------------------------------------

def _cut_data_loaders() -> None:
    from torch.utils.data import dataloader

    nxt = dataloader._BaseDataLoaderIter.__next__

    @functools.wraps(nxt)
    def cut_next(self):
        if _STATE["cut"]:
            _STATE["empty_iters"] += 1
            if _STATE["empty_iters"] > SPIN_LIMIT:
                from fsdplint.run import sentinel

                sentinel.PROGRESS.notes.add(
                    f"after its first step the job iterated its cut data loader {SPIN_LIMIT} times without a "
                    "save (a loop over steps around an epoch, not ended by the data): the run stopped there")
                raise sentinel.ReachedStop("end")
            raise StopIteration
        return nxt(self)

    dataloader._BaseDataLoaderIter.__next__ = cut_next


# -- where writes go -----------------------------------------------------------------------------------

def _redirect(path):
    """A path the job gave a save function, under the run's own directory (kept as is when already
    there, or when it is not a path: a buffer)."""
    if not isinstance(path, (str, os.PathLike)):
        return path
    p = os.path.abspath(os.fspath(path))
    root = _STATE["root"]
    if p == root or p.startswith(root + os.sep):
        return p
    _STATE["n"] += 1
    out = os.path.join(root, str(_STATE["n"]), os.path.basename(p.rstrip(os.sep)) or "out")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    return out


def _replace_everywhere(old, new) -> None:
    """`from safetensors.torch import save_file as safe_save_file` binds the function in the importing
    module: each loaded module holding it gets the redirecting one."""
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not d:
            continue
        for k, v in list(d.items()):
            if v is old:
                try:
                    setattr(mod, k, new)
                except (AttributeError, TypeError):
                    pass


def _writes() -> None:
    """The functions that put tensors in files: their path goes under the run's directory, and
    what they were given is kept for the judgement of the save point around them."""
    import torch

    save = torch.save

    @functools.wraps(save)
    def redirected_save(obj, f, *args, **kwargs):
        bare = _bare_write("torch.save", f)
        _payload(_display_name(f), obj)
        out = save(obj, _redirect(f), *args, **kwargs)
        if bare:
            _end_of_save(None)
        return out

    _replace_everywhere(save, redirected_save)
    torch.save = redirected_save
    try:
        import safetensors.torch as st
    except ImportError:
        return
    save_file = st.save_file

    @functools.wraps(save_file)
    def redirected_save_file(tensors, filename, *args, **kwargs):
        bare = _bare_write("safetensors.torch.save_file", filename)
        _payload(_display_name(filename), tensors)
        out = save_file(tensors, _redirect(filename), *args, **kwargs)
        if bare:
            _end_of_save(None)
        return out

    _replace_everywhere(save_file, redirected_save_file)
    st.save_file = redirected_save_file
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError:
        return
    dcp_save = getattr(dcp, "save", None)
    if dcp_save is None:
        return

    @functools.wraps(dcp_save)
    def redirected_dcp_save(state_dict, *args, checkpoint_id=None, storage_writer=None, **kwargs):
        target = checkpoint_id if checkpoint_id is not None else getattr(storage_writer, "path", None)
        where = _redirect(target if target is not None else os.path.join(_STATE["root"], "dcp"))
        bare = _bare_write("torch.distributed.checkpoint.save", target)
        _payload(_display_name(target or "dcp"), state_dict, distributed=True)
        out = dcp_save(state_dict, *args, checkpoint_id=where, storage_writer=dcp.FileSystemWriter(where), **kwargs)
        if bare:
            _end_of_save(None)
        return out

    _replace_everywhere(dcp_save, redirected_dcp_save)


def _display_name(f) -> str:
    return os.path.basename(os.fspath(f).rstrip(os.sep)) if isinstance(f, (str, os.PathLike)) else "<buffer>"


def _bare_write(label: str, path) -> bool:
    """A write after the first step outside any save call (`torch.save(sd, path)` in the job's own
    loop): its own save point."""
    if _STATE["depth"] or _STATE["payloads"] is not None or not _STATE["stepped"]:
        return False
    _STATE.update(payloads=[], call=label, frame=_frame(), model_level=False, target=_shown(path),
                  state_dict_given=False)
    return True


def _payload(name: str, obj, distributed: bool = False) -> None:
    if _STATE["payloads"] is None:
        return
    tensors = list(_tensors(obj))
    _STATE["payloads"].append({"name": name, "tensors": tensors, "distributed": distributed})


def _tensors(obj, prefix: str = "", depth: int = 0):
    import torch

    if depth > 6:
        return
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}.{i}" if prefix else str(i), depth + 1)
    else:
        try:
            from torch.distributed._shard.sharded_tensor import ShardedTensor
        except ImportError:
            return
        if isinstance(obj, ShardedTensor):
            yield prefix, obj


# -- the save calls ------------------------------------------------------------------------------------

def _save_calls() -> None:
    """The outermost save call after the first step is the save point: its directory argument (or the
    Trainer's output_dir) is redirected, nested calls write under it, and the rank stops after it."""
    targets = []
    try:
        from transformers import PreTrainedModel, Trainer
        from transformers.configuration_utils import PretrainedConfig
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase

        targets += [(PreTrainedModel, "save_pretrained", "dir"), (Trainer, "save_model", "trainer"),
                    (Trainer, "_save_checkpoint", "trainer"), (PretrainedConfig, "save_pretrained", "aside"),
                    (PreTrainedTokenizerBase, "save_pretrained", "aside")]
    except ImportError:
        pass
    try:
        from peft import PeftModel
        from peft.config import PeftConfigMixin

        targets += [(PeftModel, "save_pretrained", "dir"), (PeftConfigMixin, "save_pretrained", "aside")]
    except ImportError:
        pass
    try:
        from accelerate import Accelerator

        targets += [(Accelerator, "save_state", "accelerate"), (Accelerator, "save_model", "accelerate_model")]
    except ImportError:
        pass
    for cls, attr, how in targets:
        _hook(cls, attr, how)
    try:
        from transformers import Trainer
    except ImportError:
        return
    init = Trainer.__init__

    @functools.wraps(init)
    def redirected_init(self, *args, **kwargs):
        targs = kwargs.get("args") if "args" in kwargs else (args[1] if len(args) > 1 else None)
        _redirect_output_dir(targs)
        # A subclass's own save methods (trl's SFTTrainer writes its model card in `_save_checkpoint`)
        # are the outermost save call.
        for klass in type(self).__mro__:
            if klass is Trainer:
                break
            for attr in ("save_model", "_save_checkpoint"):
                _hook(klass, attr, "trainer")
        init(self, *args, **kwargs)
        _redirect_output_dir(getattr(self, "args", None))

    Trainer.__init__ = redirected_init


def _hook(cls, attr: str, how: str) -> None:
    fn = cls.__dict__.get(attr)
    if fn is None or getattr(fn, "_fsdplint_save", False):
        return
    setattr(cls, attr, _save_call(f"{cls.__name__}.{attr}", fn, how))


def _redirect_output_dir(targs) -> None:
    """The Trainer writes under `output_dir` from its constructor on (the directory, checkpoints, the model
    card, logs): the whole directory is the run's own; the report names the job's."""
    out = getattr(targs, "output_dir", None)
    if not out or getattr(targs, "_fsdplint_output_dir", None):
        return
    try:
        targs._fsdplint_output_dir = out
        targs.output_dir = _redirect(out)
        logs = getattr(targs, "logging_dir", None)
        if isinstance(logs, str) and os.path.abspath(logs).startswith(os.path.abspath(out) + os.sep):
            targs.logging_dir = os.path.join(targs.output_dir, os.path.relpath(os.path.abspath(logs), os.path.abspath(out)))
    except (AttributeError, TypeError):  # frozen arguments: the per-call redirect below still applies
        pass


def _save_call(label: str, fn, how: str):
    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        args, kwargs, restore = _redirected_args(how, self, args, kwargs)
        outer = _STATE["depth"] == 0 and _STATE["payloads"] is None and how != "aside"
        if outer:
            _STATE.update(payloads=[], call=label, frame=_frame(), model_level=label in _MODEL_LEVEL,
                          target=restore.get("shown"), state_dict_given=kwargs.get("state_dict") is not None)
        _STATE["depth"] += 1
        try:
            out = fn(self, *args, **kwargs)
        finally:
            _STATE["depth"] -= 1
            if restore.get("args") is not None:
                restore["args"].output_dir = restore["output_dir"]
        if outer:
            _end_of_save(self)
        return out

    call._fsdplint_save = True
    return call


def _redirected_args(how: str, obj, args, kwargs):
    restore: dict = {}
    if how in ("dir", "aside"):
        if args:
            restore["shown"] = _shown(args[0])
            args = (_redirect(args[0]), *args[1:])
        elif "save_directory" in kwargs:
            restore["shown"] = _shown(kwargs["save_directory"])
            kwargs["save_directory"] = _redirect(kwargs["save_directory"])
    elif how == "trainer":
        targs = getattr(obj, "args", None)
        if targs is not None and getattr(targs, "output_dir", None):
            shown = getattr(targs, "_fsdplint_output_dir", None) or targs.output_dir
            restore.update(args=targs, output_dir=targs.output_dir, shown=_shown(shown))
            targs.output_dir = _redirect(targs.output_dir)
        if kwargs.get("output_dir") or (args and isinstance(args[0], (str, os.PathLike))):
            given = kwargs.get("output_dir") or args[0]
            restore["shown"] = _shown(given)
            if "output_dir" in kwargs:
                kwargs["output_dir"] = _redirect(given)
            else:
                args = (_redirect(given), *args[1:])
    elif how == "accelerate":
        given = kwargs.pop("output_dir", args[0] if args else None)
        args = args[1:] if args else args
        restore["shown"] = _shown(given or "accelerate state")
        kwargs["output_dir"] = _redirect(given or os.path.join(_STATE["root"], "state"))
    elif how == "accelerate_model":
        if len(args) > 1:
            restore["shown"] = _shown(args[1])
            args = (args[0], _redirect(args[1]), *args[2:])
        elif "save_directory" in kwargs:
            restore["shown"] = _shown(kwargs["save_directory"])
            kwargs["save_directory"] = _redirect(kwargs["save_directory"])
    return args, kwargs, restore


def _shown(path) -> str:
    return os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)


def _frame():
    from fsdplint.run import errors, ranks

    return errors.deepest_user_frame(traceback.extract_stack(), ranks._STATE["user_root"] or os.getcwd())


def _end_of_save(obj) -> None:
    """The outermost save call returned: a save point after the first step when it wrote weights or
    saves the model itself; the rank stops here."""
    payloads, label = _STATE["payloads"], _STATE["call"]
    _STATE["payloads"] = None
    if not _STATE["stepped"]:
        return
    if not _STATE["model_level"] and not any(p["tensors"] for p in payloads or ()):
        return  # a config, a tokenizer, a log: not the save of the weights
    _judge(label, payloads or [], obj)
    from fsdplint.run import sentinel

    raise sentinel.ReachedStop("save")


# -- what was written ----------------------------------------------------------------------------------

def _judge(label: str, payloads: list, obj) -> None:
    from fsdplint.run import sentinel

    model = sentinel.PROGRESS.wrapped_model()
    full = full_shapes(model) if model is not None else {}
    adapters = _adapter_names(model)
    entry = {"call": label, "target": _STATE.get("target"), "frame": _STATE.get("frame"), "files": [],
             "trainer_fsdp": bool(getattr(obj, "is_fsdp_enabled", False)) if label.startswith("Trainer.") else False,
             "state_dict_type": _state_dict_type(obj) if label.startswith("Trainer.") else None,
             "state_dict_given": bool(_STATE.get("state_dict_given")), "nested_fsdp1": _nested_fsdp1(obj),
             "peft": _peft_version()}
    for p in payloads:
        entry["files"].append(_judge_file(p, full, adapters, label))
    SAVES.append(entry)


def _nested_fsdp1(obj) -> bool:
    """The saving module's own module names hold FSDP1's wrapper segment (`_fsdp_wrapped_module.` inside a
    name: units nested below it), which the keys of a gathered state dict do not."""
    try:
        return any("._fsdp_wrapped_module" in n or n.startswith("_fsdp_wrapped_module.")
                   for n, _ in obj.named_modules()) if obj is not None else False
    except Exception:  # noqa: BLE001
        return False


def _peft_version() -> str:
    try:
        import peft

        return peft.__version__
    except Exception:  # noqa: BLE001
        return ""


def _state_dict_type(trainer) -> str | None:
    try:
        plugin = trainer.accelerator.state.fsdp_plugin
    except AttributeError:
        return None
    return str(getattr(plugin, "state_dict_type", "")) if plugin is not None else None


def _judge_file(payload: dict, full: dict, adapters: set, label: str) -> dict:
    tensors = payload["tensors"]
    name = payload["name"]
    adapter = "adapter_model" in name or label == "PeftModel.save_pretrained"
    out = {"name": name, "tensors": len(tensors), "adapter": adapter, "elements": 0, "empty": [], "smaller": [],
           "sharded": [], "distributed": payload.get("distributed", False)}
    for key, t in tensors:
        kind = type(t).__name__
        if kind in ("DTensor", "ShardedTensor"):
            out["sharded"].append(f"{key} ({kind})")
            continue
        n = t.numel()
        out["elements"] += n
        want = _full_shape(key, full, adapters)
        if n == 0:
            out["empty"].append(key)
        elif want is not None and tuple(t.shape) != want and t.numel() < _numel(want):
            out["smaller"].append(f"{key} {list(t.shape)} of {list(want)}")
    for k in ("empty", "smaller", "sharded"):
        out[k + "_count"] = len(out[k])
        out[k] = out[k][:3]
    return out


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _adapter_names(model) -> set:
    names = set()
    for m in (model.modules() if model is not None else ()):
        cfg = getattr(m, "peft_config", None)
        if isinstance(cfg, dict):
            names.update(cfg)
    return names


def _clean(name: str) -> str:
    for part in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(part, "")
    return name[len("module."):] if name.startswith("module.") else name  # a DDP-style wrapper's prefix


def _full_shape(key: str, full: dict, adapters: set):
    """The model's own (unsharded) shape of a saved key: by name, with the adapter name peft drops from
    the keys it saves, matched on whole dotted suffixes (a prefix such as `base_model.model.` may differ)."""
    k = _clean(key)
    if k in full:
        return full[k]
    best = None
    for name, shape in full.items():
        stripped = name
        for a in adapters:
            stripped = stripped.replace(f".{a}.", ".")
        for cand in (name, stripped):
            if cand == k or cand.endswith("." + k) or k.endswith("." + cand):
                best = shape
                break
        if best is not None:
            return best
    return None


def full_shapes(model) -> dict:
    """Each parameter's full (unsharded) shape by its clean name: FSDP1 flat parameters by the shapes
    they flatten, FSDP2 DTensors by their global shape, other parameters as they are."""
    out = {}
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    except ImportError:
        FSDP = ()
    for mname, m in model.named_modules():
        fp = getattr(m, "_flat_param", None) if FSDP and isinstance(m, FSDP) else None
        if fp is None or not hasattr(fp, "_fqns"):
            continue
        prefix = _clean(mname + "." if mname else "")
        for fqn, shape in zip(fp._fqns, fp._shapes):
            out[_clean(prefix + fqn)] = tuple(shape)
    for name, p in model.named_parameters():
        if "_flat_param" in name:
            continue
        out.setdefault(_clean(name), tuple(p.shape))
    return out


def record() -> list:
    return SAVES


# -- the parent ------------------------------------------------------------------------------------------

def findings(result) -> list:
    """FSDP402 for an adapter written without its weights or with one rank's shard of them, FSDP404 for a
    Trainer save_model under a sharded state-dict type that wrote no weights."""
    from fsdplint.findings import Position
    from fsdplint.runtime.codes import make_finding

    per_rank = {r.rank: (r.data.get("saves") or []) for r in result.ranks}
    targets = {rank: {s.get("target") for s in saves} for rank, saves in per_rank.items()}
    judged: dict = {}  # (code, message, frame) -> ranks: one finding for what several ranks wrote alike
    for rank, saves in sorted(per_rank.items()):
        for s in saves:
            message, code = _verdict(s, rank, targets), "FSDP402"
            if not message:
                message, code = _no_weights(s, rank), "FSDP404"
            if message:
                judged.setdefault((code, message, tuple(s.get("frame") or ())), []).append(rank)
    out = []
    for (code, message, frame), ranks in judged.items():
        f = make_finding(code, message + f" [rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
                                         f"of {result.world_size}]")
        f.notes["ranks"] = ",".join(map(str, ranks))
        if frame:
            f.filename, f.start, f.end = frame[0], Position(frame[1], 1), Position(frame[1], 1)
            f.source_line = frame[2]
        out.append(f)
    return out


def _verdict(save: dict, rank: int, targets: dict) -> str:
    where = f"{save['call']}({save.get('target') or ''})"
    # A per-rank file (each rank its own path) is a sharded checkpoint by design; one path every rank
    # shares, or one rank alone writes, keeps one rank's shard.
    shared = all(save.get("target") in t for t in targets.values()) or \
        not any(save.get("target") in t for r, t in targets.items() if r != rank)
    for f in save.get("files") or ():
        if f.get("distributed"):
            continue  # torch.distributed.checkpoint writes every rank's shards by design
        if f["adapter"] and (f["tensors"] == 0 or f["empty_count"] == f["tensors"]):
            held = "no tensor" if f["tensors"] == 0 else f"only empty tensors ({', '.join(f['empty'])})"
            if save.get("state_dict_given") and save.get("nested_fsdp1"):
                return (f"{where} writes an adapter ({f['name']}) holding {held}, though it was given a state dict: "
                        f"peft {save.get('peft') or ''} picks the adapter's entries by its model's module names, which "
                        "under FSDP1's nested units contain `_fsdp_wrapped_module.` where the gathered state dict's "
                        "keys do not, so it matches none of them. Write the LoRA entries of the gathered state dict "
                        "yourself (safetensors save_file of its `lora_` keys, the adapter name dropped, beside "
                        "model.peft_config[name].save_pretrained(out)), or shard with FSDP2, whose module names are "
                        "the model's own")
            return (f"{where} writes an adapter ({f['name']}) holding {held}: it was taken from the sharded model, "
                    "whose parameters outside forward are this rank's flat shard, not the adapter. Gather a full "
                    "state dict on every rank (FSDP1: FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, "
                    "FullStateDictConfig(offload_to_cpu=True, rank0_only=True)); FSDP2: get_model_state_dict(model, "
                    "options=StateDictOptions(full_state_dict=True, cpu_offload=True))) and pass it as "
                    "save_pretrained(..., state_dict=sd)")
        if not shared:
            continue
        if f["smaller_count"] or f["sharded_count"]:
            what = (f"{f['smaller_count']} tensors smaller than the model's ({', '.join(f['smaller'])})"
                    if f["smaller_count"] else
                    f"{f['sharded_count']} sharded tensors ({', '.join(f['sharded'])})")
            return (f"{where} writes {f['name']} with {what}: this rank's shard, not the full "
                    f"{'adapter' if f['adapter'] else 'model'}, to a path {'only this rank writes' if len(targets) > 1 else 'every rank shares'}. "
                    "Gather a full state dict on every rank first (FSDP1 FULL_STATE_DICT context; FSDP2 "
                    "get_model_state_dict(..., full_state_dict=True)) and write it from rank 0, or save "
                    "with torch.distributed.checkpoint")
    return ""


def _no_weights(save: dict, rank: int) -> str:
    if save["call"] != "Trainer.save_model" or not save.get("trainer_fsdp") or rank != 0:
        return ""
    sdt = save.get("state_dict_type") or ""
    if "FULL_STATE_DICT" in sdt:
        return ""
    if any(f["tensors"] for f in save.get("files") or ()):
        return ""
    return (f"trainer.save_model({save.get('target') or ''}) under FSDP with state_dict_type "
            f"{sdt.split('.')[-1] or 'not FULL_STATE_DICT'} writes no model or adapter weights (no "
            "model.safetensors, no adapter_model.safetensors). Switch the plugin to FULL_STATE_DICT before "
            "saving (trainer.accelerator.state.fsdp_plugin.set_state_dict_type(\"FULL_STATE_DICT\"))")
