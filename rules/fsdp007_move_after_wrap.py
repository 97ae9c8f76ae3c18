import libcst as cst

from fsdplint.analysis import UNKNOWN, QName
from fsdplint.findings import Severity
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid

LABEL = {"wrap1": "FullyShardedDataParallel", "shard2": "fully_shard", "prepare": "accelerator.prepare (FSDP)"}
ACCELERATE_FSDP2 = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_offload_params: true\n"
DTYPES = {"float16", "half", "bfloat16", "float32", "float", "float64", "double"}


class MoveAfterWrap(Rule):
    code = "FSDP007"
    name = "move-after-wrap"
    severity = Severity.WARNING
    sides = "S"
    summary = "`.to()`/`.cuda()` on a model after FSDP wrapping."
    message = (
        "`.{method}()` moves the model after it was wrapped with {wrap} (line {line}): FSDP already placed the "
        "shards (on the device of device_id / the mesh, or on CPU with offloading), and moving the wrapped model "
        "leads to device-mismatch errors. Move the model before wrapping, or let FSDP place it (device_id= for "
        "FSDP1, the mesh for fully_shard)."
    )
    doc = """
    ## What it does
    Finds `model.to(device)` / `model.cuda()` on a model that was already wrapped with
    `FullyShardedDataParallel`, `fully_shard` (on the model or any of its layers), or prepared by accelerate
    under an FSDP launch config. For FSDP2 only moves of CPU-offloaded shards are reported: `fully_shard`
    re-registers its shards after `nn.Module._apply`, so moving to the mesh's device is harmless there.

    ## Why is this bad?
    FSDP owns parameter placement: FSDP1 moves each unit to `device_id` and keeps `FlatParameter` shards
    there (on CPU with `CPUOffload`); FSDP2 moves the DTensor shards to the mesh's device (or keeps them on
    CPU with `CPUOffloadPolicy`). Moving the wrapped module afterwards moves some tensors and not FSDP's
    internal buffers, which ends in device-mismatch errors at the next forward, or silently undoes CPU
    offloading.

    ## Example
    ```python
    model = FSDP(model, cpu_offload=CPUOffload(offload_params=True))
    model.to("cuda")
    ```

    ## Use instead
    ```python
    model = FSDP(model, device_id=torch.cuda.current_device())
    ```

    ## Fix safety
    No automatic fix: where the model should live is a decision about memory.

    ## Versions
    All versions of torch.

    ## References
    - pytorch#157209, pytorch#149395
    - https://pytorch.org/docs/stable/fsdp.html (`device_id`)
    """
    references = ("pytorch#157209", "pytorch#149395")

    VALID = [
        # One helper prepares each object, in two passes (accelerate's prepare): in every call of
        # prepare_model the move runs before the wrap.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


        class Preparer:
            def prepare_model(self, model):
                model = model.to(self.device)
                model = FSDP(model, **self.fsdp_kwargs)
                return model

            def _prepare_one(self, obj, first_pass=False):
                if first_pass and isinstance(obj, torch.nn.Module):
                    return self.prepare_model(obj)
                return obj

            def prepare(self, model):
                model = self._prepare_one(model, first_pass=True)
                model = self._prepare_one(model)
                return model
        """,
        # The policy may be None on this path (an actor keeps its shards on the GPU): not known offloaded.
        """
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        offload = None if role == "actor" else CPUOffloadPolicy(pin_memory=True)
        fully_shard(model, offload_policy=offload)
        model.to("cuda")
        """,
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = model.to(device)
        model = FSDP(model, device_id=device)
        """,
        # Dtype casts and meta materialisation are not moves.
        """
        import torch
        from torch.distributed.fsdp import fully_shard
        with torch.device("meta"):
            model = Transformer(args)
        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
        model.to_empty(device="cuda")
        model.to(torch.bfloat16)
        """,
        # Batches are moved, not the model.
        """
        import torch.distributed.fsdp as f
        f.fully_shard(model)
        for batch in loader:
            batch = batch.to(device)
            loss = model(**batch).loss
        """,
        # The name is rebound to a freshly loaded model for evaluation.
        """
        from transformers import AutoModelForCausalLM
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, device_id=rank)
        train(model)
        model = AutoModelForCausalLM.from_pretrained("out")
        model.to("cuda")
        """,
        # Another object is moved after the model is wrapped.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel
        model = FullyShardedDataParallel(model, device_id=rank)
        ref_model = ref_model.cuda()
        """,
        # The move is in the branch that does not wrap (llama-cookbook's finetuning.py).
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def main(train_config, model):
            if train_config.enable_fsdp:
                model = FSDP(model, device_id=torch.cuda.current_device())
            elif not train_config.quantization and not train_config.enable_fsdp:
                model.to("cuda")
        """,
        # FSDP2 re-registers its shards after `nn.Module._apply`: without CPU offloading, moving the sharded
        # model to the mesh's device is harmless (verl's tests do `model = apply_fsdp2(model, mesh).cuda()`).
        """
        from torch.distributed.fsdp import fully_shard

        def apply_fsdp2(model, device_mesh):
            for layer in model.model.layers:
                fully_shard(layer, mesh=device_mesh)
            fully_shard(model, mesh=device_mesh)
            return model

        model1 = apply_fsdp2(model1, device_mesh)
        model1 = model1.cuda()
        """,
        # accelerate without an FSDP config (DDP or single GPU): prepare does not shard.
        Valid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, optimizer = accelerator.prepare(model, optimizer)
            model.to(accelerator.device)
            """,
            options={"accelerate_config": "distributed_type: MULTI_GPU\nnum_processes: 2\n"},
        ),
    ]
    INVALID = [
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, CPUOffload
            model = FSDP(model, cpu_offload=CPUOffload(offload_params=True))
            model.to("cuda")
            """,
            line=3,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as f
            from peft import get_peft_model as add_lora

            def build(model, cfg, device):
                model = add_lora(model, cfg)
                for layer in model.base_model.model.model.layers:
                    f.fully_shard(layer, offload_policy=f.CPUOffloadPolicy())
                f.fully_shard(model, offload_policy=f.CPUOffloadPolicy())
                model = model.to(device)
                return model
            """,
            line=9,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel

            def wrap(m):
                return FullyShardedDataParallel(m, use_orig_params=True)

            model = wrap(model)
            model.cuda()
            """,
            line=7,
        ),
        Invalid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, optimizer = accelerator.prepare(model, optimizer)
            model.to(accelerator.device)
            """,
            options={"accelerate_config": ACCELERATE_FSDP2},
            line=4,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        launch_fsdp = a.launch_fsdp_version is not None
        kinds = ("wrap1", "shard2", "prepare") if launch_fsdp else ("wrap1", "shard2")
        for t in a.timelines:
            for mv in t.of("move"):
                if mv.entity is None or (mv.ref and mv.ref.child) or _is_dtype_cast(a, mv.call):
                    continue
                wraps = [w for w in t.before(mv, kinds) if not _earlier_in_same_function(mv, w)]
                if not wraps:
                    continue
                w = wraps[0]
                if all(e.kind in ("shard2", "prepare") for e in wraps) and not _fsdp2_offloaded(a, wraps):
                    if all(e.kind == "shard2" for e in wraps) or a.launch_fsdp_version == 2:
                        continue  # FSDP2 re-registers its shards after `.to()`; only offloaded shards must stay put
                if any(e.kind == "load" and w.seq < e.seq < mv.seq for e in t.events):
                    continue  # a model was (re)loaded in between: the name may hold a new, unwrapped model
                msg = self.message.format(method=mv.data.get("method", "to"), wrap=LABEL[w.kind], line=ctx.line(w.node))
                ctx.report(mv.node, msg)


def _earlier_in_same_function(mv, w) -> bool:
    """The move comes before the wrap in the same function (and no loop of it holds both): in each call of
    that function the move runs first; a wrap from an earlier call of it (e.g. a `prepare_model(obj)` helper
    called once per object) acted on that call's argument, not on this one's."""
    m, c = mv.call, w.call
    if m is None or c is None or m.scope is not c.scope or m.scope.node is None or m.seq > c.seq:
        return False
    shared = {id(lp.node) for lp in m.loops} & {id(lp.node) for lp in c.loops}
    return not shared and not (m.whiles and c.whiles)


def _fsdp2_offloaded(a, wraps) -> bool:
    """FSDP2 shards kept on CPU: `offload_policy=` on a fully_shard call, or `offload_params` in the launch config."""
    for e in wraps:
        if e.kind == "prepare":
            launch = getattr(a, "launch", None)
            if launch is not None and launch.value("offload_params") is True:
                return True
            continue
        expr = a.keyword(e.call, "offload_policy") if e.call is not None else None
        if expr is not None and expr is not UNKNOWN:
            v = a.value(expr, e.call.scope)
            if v is UNKNOWN and isinstance(expr, (cst.Name, cst.Attribute)):
                # `CPUOffloadPolicy()` bound to a name counts; `None if actor else CPUOffloadPolicy()` is not known.
                d = dotted(expr)
                bound = a.binding(d, e.call.scope) if d else None
                v = UNKNOWN if isinstance(bound, cst.Call) else None
            if v is not None:
                return True
    return False


def _is_dtype_cast(a, call) -> bool:
    """`.to(torch.bfloat16)` / `.to(dtype=...)`: changes the dtype, not the device."""
    if call is None or call.method != "to":
        return False
    args = [x for x in call.node.args if not x.star]
    if not args:
        return True
    if any(x.keyword is not None and x.keyword.value == "device" for x in args):
        return False
    first = args[0]
    if first.keyword is not None:
        return first.keyword.value == "dtype"
    v = a.value(first.value, call.scope)
    return isinstance(v, QName) and v.name.rsplit(".", 1)[-1] in DTYPES
