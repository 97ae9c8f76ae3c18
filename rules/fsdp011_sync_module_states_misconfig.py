import re

from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import Replace, add_keyword, safe
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid

LOADERS = ("load_model", "PeftModel_from_pretrained")
RANK_TEST = re.compile(r"(get_rank|process_index|local_process_index)\(?\)?\s*(==|!=)\s*0")


class SyncModuleStatesMisconfig(Rule):
    code = "FSDP011"
    name = "sync-module-states-misconfig"
    severity = Severity.ERROR
    sides = "SR"
    fix = Applicability.SAFE
    versions = {"torch": ">=1.12"}
    summary = "Rank-0-only loading without `sync_module_states=True` (+ device_id), or the reverse."
    message_rank0 = (
        "The weights are loaded on {which} only (line {line}), but FullyShardedDataParallel is called without "
        "sync_module_states=True: the other ranks shard their own uninitialised/meta weights and train from "
        "garbage. Pass sync_module_states=True (and device_id=) so FSDP broadcasts rank 0's weights."
    )
    message_cpu = (
        "FullyShardedDataParallel(sync_module_states=True) on a model that is still on the CPU and without "
        "device_id: FSDP raises \"The module has CPU parameters or buffers when `sync_module_states=True`, which "
        "requires them to be on GPU\". Pass device_id= (e.g. torch.cuda.current_device())."
    )
    message_yaml = (
        "fsdp_cpu_ram_efficient_loading loads the weights on rank 0 only, which needs fsdp_sync_module_states: "
        "true to broadcast them; with false, `accelerate launch` refuses the config (\"When using "
        "`--fsdp_cpu_ram_efficient_loading` set `--fsdp_sync_module_states` to `True`\"). Set "
        "fsdp_sync_module_states: true."
    )
    doc = """
    ## What it does
    - FSDP1 on a model whose weights are loaded on rank 0 only (`if rank == 0: from_pretrained(...) else:
      meta/empty model`) without `sync_module_states=True`.
    - `FullyShardedDataParallel(sync_module_states=True)` on a model still on the CPU, without `device_id`.
    - accelerate configs with `fsdp_cpu_ram_efficient_loading: true` and `fsdp_sync_module_states: false`.
    - Under `fsdplint run`: a simulated rank whose shards nothing fills. Each rank loads as the real stack
      loads it (the job's own rank guard; transformers' cpu-RAM-efficient loader on a non-zero local rank),
      and the run records, at each wrap, the parameters on meta or holding memory `to_empty()` left
      uninitialized: reported when FSDP1 wraps them without `sync_module_states=True`, when the rank the
      broadcast comes from holds nothing either, and (FSDP2) when they still hold nothing at the first
      optimizer step (no `set_model_state_dict(..., broadcast_from_rank0=True)` or load filled them).

    ## Why is this bad?
    Rank-0-only loading saves host memory, but then only rank 0 holds the real weights. FSDP broadcasts
    them only with `sync_module_states=True`; otherwise every other rank shards and trains its own
    random or empty weights, silently. The broadcast runs on the GPU: with the model still on the CPU and no
    `device_id`, FSDP raises `ValueError: The module has CPU parameters or buffers when
    sync_module_states=True ...`. accelerate's launcher rejects `cpu_ram_efficient_loading` without
    `sync_module_states`.

    ## Example
    ```python
    if rank == 0:
        model = AutoModelForCausalLM.from_pretrained(name)
    else:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    model = FSDP(model, auto_wrap_policy=policy)
    ```

    ## Use instead
    ```python
    model = FSDP(model, auto_wrap_policy=policy, sync_module_states=True,
                 device_id=torch.cuda.current_device(),
                 param_init_fn=lambda m: m.to_empty(device=torch.device("cuda"), recurse=False))
    ```

    ## Fix safety
    Safe: the fix adds `sync_module_states=True` and/or `device_id=torch.cuda.current_device()` to the
    FSDP call (only when `torch` is imported under that name; otherwise it only reports).

    ## Versions
    FSDP1 (torch >= 1.12); accelerate configs with `fsdp_cpu_ram_efficient_loading`.

    ## References
    - accelerate docs (usage_guides/fsdp.md: `cpu_ram_efficient_loading`); accelerate `utils/launch.py`,
      `utils/dataclasses.py`
    - pytorch FSDP `_init_utils.py` (`_check_module_states_for_sync_module_states`); transformers#32276
    """
    references = ("transformers#32276",)

    VALID = [
        """
        import torch
        from transformers import AutoModelForCausalLM
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        if rank == 0:
            model = AutoModelForCausalLM.from_pretrained(name)
        else:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
        model = FSDP(
            model,
            sync_module_states=True,
            device_id=torch.cuda.current_device(),
            param_init_fn=lambda m: m.to_empty(device=torch.device("cuda"), recurse=False),
        )
        """,
        # Every rank loads the weights: no broadcast needed.
        """
        from transformers import AutoModelForCausalLM
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = AutoModelForCausalLM.from_pretrained(name)
        model = FSDP(model, device_id=local_rank)
        """,
        # The model is moved to the GPU before wrapping.
        """
        from transformers import AutoModelForCausalLM
        import torch.distributed.fsdp as fsdp
        model = AutoModelForCausalLM.from_pretrained(name).cuda()
        model = fsdp.FullyShardedDataParallel(model, sync_module_states=True)
        """,
        # A quantized load without device_map lands on the current GPU (transformers' quantizers set it).
        """
        import torch
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.float32)
        model = AutoModelForCausalLM.from_pretrained(name, quantization_config=bnb, dtype=torch.float32)
        FSDP(model, auto_wrap_policy=policy, use_orig_params=False, sync_module_states=True)
        """,
        # FSDP settings passed through **kwargs: not known statically.
        """
        from transformers import AutoModelForCausalLM
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        if local_rank == 0:
            model = AutoModelForCausalLM.from_pretrained(name)
        else:
            model = build_empty(config)
        model = FSDP(model, **fsdp_kwargs)
        """,
        Valid(
            """
            from accelerate import Accelerator
            from transformers import AutoModelForCausalLM
            accelerator = Accelerator()
            model = AutoModelForCausalLM.from_pretrained(name)
            model = accelerator.prepare(model)
            """,
            options={"accelerate_config": (
                "distributed_type: FSDP\n"
                "fsdp_config:\n"
                "  fsdp_cpu_ram_efficient_loading: true\n"
                "  fsdp_sync_module_states: true\n"
            )},
        ),
        # The Trainer forces sync_module_states=True (with a warning) when cpu_ram_efficient_loading is on.
        """
        from transformers import TrainingArguments
        args = TrainingArguments(
            output_dir="out",
            fsdp="full_shard auto_wrap",
            fsdp_config={"cpu_ram_efficient_loading": True, "sync_module_states": False},
        )
        """,
    ]
    INVALID = [
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            if rank == 0:
                model = AutoModelForCausalLM.from_pretrained(name)
            else:
                with torch.device("meta"):
                    model = AutoModelForCausalLM.from_config(config)
            model = FSDP(model, auto_wrap_policy=policy)
            """,
            line=9,
            expected_fix="""
            import torch
            from transformers import AutoModelForCausalLM
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            if rank == 0:
                model = AutoModelForCausalLM.from_pretrained(name)
            else:
                with torch.device("meta"):
                    model = AutoModelForCausalLM.from_config(config)
            model = FSDP(model, auto_wrap_policy=policy, sync_module_states=True, device_id=torch.cuda.current_device())
            """,
        ),
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM as AM
            import torch.distributed.fsdp as f
            model = AM.from_pretrained(name, torch_dtype=torch.bfloat16)
            model = f.FullyShardedDataParallel(model, sync_module_states=True, use_orig_params=True)
            """,
            line=5,
            expected_fix="""
            import torch
            from transformers import AutoModelForCausalLM as AM
            import torch.distributed.fsdp as f
            model = AM.from_pretrained(name, torch_dtype=torch.bfloat16)
            model = f.FullyShardedDataParallel(model, sync_module_states=True, use_orig_params=True, device_id=torch.cuda.current_device())
            """,
        ),
        Invalid(
            """
            import torch.distributed as dist
            from transformers import LlamaForCausalLM
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            def main():
                if dist.get_rank() == 0:
                    model = LlamaForCausalLM.from_pretrained(path)
                else:
                    model = LlamaForCausalLM.from_config(cfg)
                model = FSDP(model, sync_module_states=False, device_id=dist.get_rank() % 8)
            """,
            line=10,
        ),
        Invalid(
            """
            from accelerate import Accelerator
            from transformers import AutoModelForCausalLM
            accelerator = Accelerator()
            model = AutoModelForCausalLM.from_pretrained(name)
            model = accelerator.prepare(model)
            """,
            options={"accelerate_config": (
                "distributed_type: FSDP\n"
                "fsdp_config:\n"
                "  fsdp_cpu_ram_efficient_loading: true\n"
                "  fsdp_sync_module_states: false\n"
            )},
            line=4,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        self._check_launch(ctx)
        for t in a.timelines:
            for w in t.of("wrap1"):
                call = w.call
                if w.entity is None or (w.ref and w.ref.child) or call is None or call.star_kwargs():
                    continue
                load_events = _loads_of(t, w.entity, w.seq)
                loads = [ev.call for ev in load_events]
                if not loads:
                    continue
                sync = a.value(call.kw("sync_module_states"), call.scope) if call.kw("sync_module_states") else False
                has_device = call.kw("device_id") is not None
                rank0 = next((ev.call for ev in load_events if _rank_dependent(a, ev)), None)
                if rank0 is not None and sync is False:
                    which = "rank 0"
                    msg = self.message_rank0.format(which=which, line=ctx.line(rank0.node))
                    ctx.report(call.node, msg, fix=_add_args(ctx, call, sync=True, device=not has_device))
                elif sync is True and not has_device and call.kw("param_init_fn") is None and _on_cpu(a, t, w, loads):
                    ctx.report(call.node, self.message_cpu, fix=_add_args(ctx, call, sync=False, device=True))

    def _check_launch(self, ctx) -> None:
        launch = getattr(ctx.analysis, "launch", None)
        report_setting = getattr(ctx, "report_setting", None)
        if launch is None or report_setting is None:
            return
        low = launch.get("cpu_ram_efficient_loading")
        sync = launch.get("sync_module_states")
        if low is None or sync is None or not _truthy(low.value) or _truthy(sync.value):
            return
        via = getattr(sync, "via", "")
        if via == "trainer" or not (str(getattr(sync, "filename", "")).endswith((".yaml", ".yml")) or via == "accelerate"):
            return  # the Trainer and FullyShardedDataParallelPlugin force it to True with a warning
        report_setting(sync, self.message_yaml)


def _rank_dependent(a, ev) -> bool:
    """The call runs on some ranks only (`if rank == 0:` / `if dist.get_rank() == 0:` and their else)."""
    rank_guard = getattr(a, "rank_guard", None)
    if rank_guard is not None and rank_guard(ev.step) is not None:
        return True
    for g in ev.call.guards:
        if g.kind in ("rank0", "not_rank0"):
            return True
        test = getattr(g.node, "test", None)
        if test is not None and RANK_TEST.search(a.code(test)):
            return True
    return False


def _truthy(v) -> bool:
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "1", "yes"))


def _loads_of(t, entity, before_seq):
    out = []
    for ev in t.events:
        call = ev.call
        if ev.seq >= before_seq or call is None or call.api not in LOADERS:
            continue
        for tg in call.targets:
            d = dotted(tg)
            if d and t.find(t.analysis._target_key(ev.step, d)) == entity:
                out.append(ev)
    return out


def _on_cpu(a, t, wrap, loads) -> bool:
    """Every load puts the model on the CPU and nothing moves it to a GPU before the wrap."""
    for ld in loads:
        if any(ld.kw(k) is not None for k in ("device_map", "quantization_config", "load_in_4bit", "load_in_8bit")):
            return False  # placed by the caller, or by transformers' quantizer on the current GPU
        for w in ld.withs:
            if "meta" in a.code(w) or "cuda" in a.code(w) or "device" in a.code(w):
                return False
    for mv in t.before(wrap, ("move",)):
        return False
    return True


def _add_args(ctx, call, *, sync: bool, device: bool):
    torch_name = next((local for local, q in ctx.analysis.resolver.names.items() if q == "torch"), None)
    node = call.node
    if sync:
        if call.kw("sync_module_states") is not None:
            from fsdplint.fixes import replace_keyword

            node = replace_keyword(node, "sync_module_states", "True")
        else:
            node = add_keyword(node, "sync_module_states", "True")
    if device:
        if torch_name is None:
            return None
        node = add_keyword(node, "device_id", f"{torch_name}.cuda.current_device()")
    if node is call.node:
        return None
    text = node
    return safe("Let FSDP broadcast rank 0's weights from the GPU", Replace(call.node, text)) if text else None
