import libcst as cst

from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import InsertLinesBefore, RemoveStatement, unsafe
from fsdplint.rule import IN_FSDP_JOB, Invalid, Rule, Valid

WRAPS = ("wrap1", "shard2", "ddp", "prepare")


class LoraAfterFsdpWrap(Rule):
    code = "FSDP101"
    name = "lora-after-fsdp-wrap"
    severity = Severity.ERROR
    sides = "SAR"
    fix = Applicability.UNSAFE
    summary = "LoRA injected (get_peft_model / inject_adapter_in_model / add_adapter) after the model was wrapped."
    message = (
        "LoRA is injected after the model was wrapped with {wrap} (line {line}): the adapter params are not "
        "sharded and their gradients are never reduced, so every rank trains its own adapter and rank 0's is saved. "
        "Inject LoRA first, then wrap."
    )
    message_new = (
        "New trainable {what} added to the model's modules after it was wrapped with {wrap} (line {line}): "
        "FSDP does not shard them nor reduce their gradients, so every rank trains its own copy. Add the "
        "adapter layers before wrapping."
    )
    doc = """
    ## What it does
    Finds `get_peft_model`, `inject_adapter_in_model`, `PeftModel.from_pretrained` or `model.add_adapter`
    applied to a model that was already wrapped with `FullyShardedDataParallel`, `fully_shard`,
    `DistributedDataParallel` or `accelerator.prepare`, and peft's `fsdp_auto_wrap_policy(model)` built
    before LoRA was injected. A project's own adapter counts too, recognised by what it does rather than
    by its name: a trainable `nn.Parameter` set on the modules of the wrapped model (`sub.lora_a =
    nn.Parameter(...)`, `setattr(sub, name, nn.Parameter(...))`, `sub.register_parameter(...)`), also
    through helpers and loader chains in other modules of the project. Parameters made from
    `distribute_tensor(...)` (sharded by the code itself) or with `requires_grad=False` are left alone.

    ## Why is this bad?
    FSDP (and DDP) manage only the parameters that exist when the model is wrapped. Adapter weights
    added later are plain replicated tensors: they are never sharded, never broadcast and their gradients
    are never all-reduced. Each rank silently trains a different adapter; rank 0's is the one saved.
    Sometimes the gradients come out NaN instead.

    ## Example
    ```python
    model = FSDP(model, auto_wrap_policy=policy)
    model = get_peft_model(model, lora_config)
    ```

    ## Use instead
    ```python
    model = get_peft_model(model, lora_config)
    model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=False)
    ```
    Order: load → `get_peft_model` → dtype cast → wrap policy from the PEFT model → wrap → optimizer.

    ## Fix safety
    Unsafe: the fix moves the LoRA statement before the wrap when both are statements of the same block.
    Code between them that expects the unwrapped model without adapters (or a policy built from it) may
    behave differently, so review the change.

    ## Versions
    All versions of torch and peft.

    ## References
    - transformers#48792 (comment); FastVideo#1666; fms-hf-tuning#143
    - https://huggingface.co/docs/peft/accelerate/fsdp
    """
    references = ("transformers#48792", "FastVideo#1666", "fms-hf-tuning#143")

    VALID = [
        # DistributedConfig without FSDP (tensor parallel only, or fsdp_size 1): from_pretrained does not shard.
        """
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, DistributedConfig
        model = AutoModelForCausalLM.from_pretrained("org/m", distributed_config=DistributedConfig(tp_size=2))
        model = get_peft_model(model, LoraConfig(r=8))
        other = AutoModelForCausalLM.from_pretrained("org/m", distributed_config=DistributedConfig(fsdp_size=1))
        other = get_peft_model(other, LoraConfig(r=8))
        """,
        # The trl trainer injects LoRA before anything wraps; FSDP comes from the Trainer, later.
        """
        from peft import LoraConfig
        from trl import SFTConfig, SFTTrainer
        args = SFTConfig(output_dir="out", fsdp="full_shard auto_wrap")
        trainer = SFTTrainer(model=model, args=args, train_dataset=ds, peft_config=LoraConfig(r=8))
        trainer.train()
        """,
        # The name is bound to a newly loaded model: the LoRA goes into that one, not into the wrapped one.
        """
        from peft import get_peft_model
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from transformers import AutoModelForCausalLM
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(name), config)
        model = FSDP(model, use_orig_params=True)
        state_dict = get_peft_model_state_dict(model)
        del model
        model = AutoModelForCausalLM.from_pretrained(name).to(device)
        model = get_peft_model(model, config)
        """,
        # Also through a loader class the linter cannot resolve (a test's `self.model_class`).
        """
        from peft import get_peft_model
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        class TestFSDP:
            def test_roundtrip(self):
                model = get_peft_model(self.model_class.from_pretrained(name), config).eval()
                model = FSDP(model, use_orig_params=True)
                model = self.model_class.from_pretrained(name).to(self.device)
                model = get_peft_model(model, config).eval()
        """,
        """
        from peft import get_peft_model
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = get_peft_model(model, lora_config)
        model = FSDP(model, use_orig_params=True)
        """,
        """
        from peft import get_peft_model
        from torch.distributed.fsdp import fully_shard
        model = get_peft_model(model, cfg)
        for layer in model.base_model.model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        """,
        """
        from peft import get_peft_model
        from accelerate import Accelerator
        accelerator = Accelerator()
        model = get_peft_model(model, cfg)
        model, optimizer = accelerator.prepare(model, optimizer)
        """,
        """
        import torch.distributed.fsdp as fsdp
        from peft import get_peft_model
        other = fsdp.FullyShardedDataParallel(other_model)
        model = get_peft_model(model, cfg)
        """,
        # DDP is dropped (`model = model.module`) before LoRA is injected (peft's EVA example).
        """
        from peft import get_peft_model
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model.to(local_rank), device_ids=[local_rank])
        eva_state_dict = get_eva_state_dict(model, dataloader, peft_config)
        model = model.module
        peft_model = get_peft_model(model, peft_config)
        """,
        # A project's own low-rank adapter, added before sharding: FSDP manages its parameters.
        """
        import torch
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        def add_side_weights(net, rank):
            for sub in net.modules():
                if isinstance(sub, nn.Linear):
                    sub.side_a = nn.Parameter(torch.zeros(rank, sub.in_features))

        add_side_weights(model, 4)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        """,
        # After sharding, parameters the code shards itself (`distribute_tensor`) or keeps frozen.
        """
        import torch.nn as nn
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import Shard, distribute_tensor

        fully_shard(model)
        for sub in model.modules():
            local = distribute_tensor(sub.scale_init, mesh, [Shard(0)])
            sub.scale = nn.Parameter(local)
            setattr(sub, "bias_table", nn.Parameter(sub.table_init, requires_grad=False))
        """,
    ]
    INVALID = [
        # The same adapter added after the model was sharded: its parameters belong to no FSDP unit.
        Invalid(
            """
            import torch
            import torch.nn as nn
            from torch.distributed.fsdp import fully_shard

            def add_side_weights(net, rank):
                for sub in net.modules():
                    if isinstance(sub, nn.Linear):
                        sub.side_a = nn.Parameter(torch.zeros(rank, sub.in_features))

            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            add_side_weights(model, 4)
            """,
            line=8,
        ),
        # Through `setattr` over the named modules of an FSDP1 model, in a helper.
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            def attach(net, names):
                for name, sub in net.named_modules():
                    for attr in names:
                        setattr(sub, attr, torch.nn.Parameter(torch.zeros(8, 8)))

            net = FSDP(net, use_orig_params=True)
            attach(net, ("up", "down"))
            """,
            line=7,
        ),
        # transformers shards the model inside from_pretrained when its DistributedConfig has fsdp_size > 1
        # (peft#3578): get_peft_model then injects LoRA into an FSDP2 model.
        Invalid(
            """
            import torch
            from peft import LoraConfig, get_peft_model
            from transformers import AutoModelForCausalLM
            from transformers.distributed import DistributedConfig
            dc = DistributedConfig(fsdp_size=4)
            net = AutoModelForCausalLM.from_pretrained("org/m", dtype=torch.bfloat16, distributed_config=dc)
            net = get_peft_model(net, LoraConfig(r=8, target_modules=["k_proj"]))
            """,
            line=7,
        ),
        # A trl trainer given peft_config injects LoRA itself, into the model the script already wrapped.
        Invalid(
            """
            from peft import LoraConfig
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from trl import SFTTrainer
            model = FSDP(model, use_orig_params=True)
            trainer = SFTTrainer(model=model, train_dataset=ds, peft_config=LoraConfig(r=8))
            """,
            line=5,
        ),
        # Only a conditional reload: on the other path the wrapped model gets the LoRA.
        Invalid(
            """
            from peft import get_peft_model
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained(name)
            model = FSDP(model, use_orig_params=True)
            if fresh:
                model = AutoModelForCausalLM.from_pretrained(name)
            model = get_peft_model(model, config)
            """,
            line=8,
        ),
        Invalid(
            """
            from peft import get_peft_model
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, use_orig_params=True)
            model = get_peft_model(model, lora_config)
            """,
            line=4,
            expected_fix="""
            from peft import get_peft_model
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = get_peft_model(model, lora_config)
            model = FSDP(model, use_orig_params=True)
            """,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as f
            from peft import get_peft_model as add_lora

            def main(model, cfg):
                for layer in model.model.layers:
                    f.fully_shard(layer)
                f.fully_shard(model)
                peft_model = add_lora(model, cfg)
                return peft_model
            """,
            line=8,
        ),
        Invalid(
            """
            from torch.distributed._composable.fsdp import fully_shard
            from peft import inject_adapter_in_model

            def shard(m):
                fully_shard(m)
                return m

            model = shard(model)
            model = inject_adapter_in_model(lora_config, model)
            """,
            line=9,
        ),
        Invalid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model = accelerator.prepare(model)
            model.add_adapter(lora_config)
            """,
            options=IN_FSDP_JOB,
            line=4,
        ),
        Invalid(
            """
            from peft import get_peft_model
            from peft.utils.other import fsdp_auto_wrap_policy
            policy = fsdp_auto_wrap_policy(model)
            model = get_peft_model(model, cfg)
            """,
            line=3,
        ),
    ]

    def check(self, ctx) -> None:
        for t in ctx.analysis.timelines:
            for lora in t.of("lora"):
                if lora.entity is None or (lora.ref and lora.ref.child):
                    continue
                wraps = [w for w in t.before(lora, WRAPS) if not (w.kind == "ddp" and _unwrapped_between(w, lora))]
                if wraps:
                    w = wraps[0]
                    label = {"wrap1": "FullyShardedDataParallel", "shard2": "fully_shard", "ddp": "DistributedDataParallel", "prepare": "accelerator.prepare"}[w.kind]
                    if w.data.get("implicit"):
                        # The library wrapped it inside a call (apis.CALL_EFFECTS): no statement to move.
                        label += f" inside `{ctx.code(w.call.node.func)}(...)`"
                        msg = self.message.format(wrap=label, line=ctx.line(w.node))
                        ctx.report(lora.node, msg)
                        continue
                    msg = self.message.format(wrap=label, line=ctx.line(w.node))
                    ctx.report(lora.node, msg, fix=_move_fix(ctx, lora, w))
            for new in t.of("new_params"):
                # The project's own adapter (`setattr(module, "lora_A", nn.Parameter(...))` over the model's
                # modules): the same parameters FSDP never saw, whatever library or helper adds them.
                if new.entity is None:
                    continue
                wraps = [w for w in t.before(new, WRAPS) if not (w.kind == "ddp" and _unwrapped_between(w, new))]
                if wraps:
                    w = wraps[0]
                    label = {"wrap1": "FullyShardedDataParallel", "shard2": "fully_shard", "ddp": "DistributedDataParallel", "prepare": "accelerator.prepare"}[w.kind]
                    name = new.data.get("name")
                    what = f"parameter `{name}`" if isinstance(name, str) else "parameters"
                    ctx.report(new.node, self.message_new.format(what=what, wrap=label, line=ctx.line(w.node)))
            for pol in t.of("peft_policy"):
                if pol.entity is not None and t.after(pol, ("lora",)):
                    ctx.report(
                        pol.node,
                        "peft's fsdp_auto_wrap_policy is built before LoRA is injected, so it cannot find the LoRA "
                        "layers and wraps them with the frozen base. Build the policy from the PEFT model, after get_peft_model.",
                    )


def _unwrapped_between(wrap, lora) -> bool:
    """`model = model.module` between the DDP wrap and the LoRA call: LoRA goes into the bare model.

    Only for DDP, whose `.module` is the untouched model; FSDP1's `.module` holds flattened parameters.
    """
    wc, lc = wrap.call, lora.call
    if wc is None or lc is None or wc.scope is not lc.scope or wrap.step.prefix != lora.step.prefix:
        return False
    arg = lc.arg(1 if lc.api == "inject_adapter_in_model" else 0, "model")
    if not isinstance(arg, cst.Name):
        return False
    for seq, value in lc.scope.assigns.get(arg.value, []):
        if wc.seq < seq <= lc.seq and isinstance(value, cst.Attribute) and value.attr.value == "module":
            return True
    return False


def _move_fix(ctx, lora, wrap):
    """Move `x = get_peft_model(...)` before the first wrap statement, when both sit in one block."""
    ls, ws = lora.call.stmt if lora.call else None, wrap.call.stmt if wrap.call else None
    if ls is None or ws is None or ls.block is not ws.block or not ls.index > ws.index:
        return None
    if lora.step.prefix or wrap.step.prefix:
        return None  # inlined from a helper: the statements are in different functions
    text = ctx.code(ls.node)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    indent = len(lines[0]) - len(lines[0].lstrip())
    body = "\n".join(ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines)
    return unsafe("Move the LoRA injection before the wrap", InsertLinesBefore(ws.node, body), RemoveStatement(ls.node))
