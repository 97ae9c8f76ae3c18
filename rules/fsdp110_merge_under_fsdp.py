from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid

from fsdplint.rules._wrapped import fsdp_state, under_context

YAML_FSDP1 = """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 1
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
num_processes: 8
"""


class MergeUnderFsdp(Rule):
    code = "FSDP110"
    name = "merge-under-fsdp"
    severity = Severity.ERROR
    summary = "`merge_and_unload()` / `merge_adapter()` on an FSDP-wrapped model."
    sides = "S"
    doc = """
    ## What it does
    Finds peft's `merge_and_unload()` or `merge_adapter()` called on a model that is wrapped with
    `FullyShardedDataParallel`/`fully_shard` (or prepared by accelerate under an FSDP config) at that point.

    ## Why is this bad?
    Merging adds `B @ A` into each base weight. Under FSDP every rank holds only shards (flat parameters
    or DTensors), so the merge fails on shape errors or writes wrong weights. peft's FSDP guide: "Merging
    when using PEFT and FSDP is currently unsupported and will raise error."

    ## Example
    ```python
    model = FSDP(peft_model)
    ...
    merged = model.merge_and_unload()
    ```

    ## Use instead
    Save the adapter (gathering a full state dict), then merge offline on an unsharded model:
    ```python
    base = AutoModelForCausalLM.from_pretrained(name)
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    ```

    ## Fix safety
    No automatic fix: merging has to move to a separate, non-distributed step.

    ## Versions
    All peft versions.

    ## References
    - peft docs accelerate/fsdp.md (Caveats)
    """
    references = ("peft docs accelerate/fsdp.md",)

    VALID = [
        # Offline merge on an unsharded model.
        """
        from peft import PeftModel
        from transformers import AutoModelForCausalLM
        base = AutoModelForCausalLM.from_pretrained(name)
        merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
        """,
        # The FSDP model saves the adapter; the merge is on another, unwrapped model.
        """
        from peft import PeftModel
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model)
        train(model)
        base = load_base()
        merged = PeftModel.from_pretrained(base, "out").merge_and_unload()
        """,
        # Merging before wrapping (e.g. a previous adapter folded in first).
        """
        from peft import get_peft_model
        from torch.distributed.fsdp import fully_shard
        model = get_peft_model(model, cfg)
        model = model.merge_and_unload()
        fully_shard(model)
        """,
        # Merging only in the branch that does not shard.
        """
        from peft import get_peft_model
        from torch.distributed.fsdp import fully_shard
        model = get_peft_model(model, cfg)
        if world_size > 1:
            for layer in model.base_model.model.model.layers:
                fully_shard(layer)
            fully_shard(model)
        train(model)
        if world_size > 1:
            save_adapter(model)
        else:
            model = model.merge_and_unload()
        """,
    ]
    INVALID = [
        Invalid(
            """
            from peft import get_peft_model
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = get_peft_model(model, cfg)
            model = FSDP(model, use_orig_params=False)
            train(model)
            merged = model.merge_and_unload()
            """,
            line=6,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as f
            from peft import get_peft_model as add_lora
            peft_model = add_lora(model, cfg)
            f.fully_shard(peft_model)
            peft_model.merge_adapter()
            """,
            line=5,
        ),
        Invalid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, opt = accelerator.prepare(model, opt)
            model.merge_and_unload().save_pretrained("merged")
            """,
            line=4,
            options={"accelerate_config": YAML_FSDP1},
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        for t in a.timelines:
            for ev in t.of("merge"):
                if ev.ref is not None and ev.ref.child:
                    continue
                if fsdp_state(a, t, ev) is None or under_context(a, ev, "summon_full_params"):
                    continue
                ctx.report(
                    ev.node,
                    "Merging LoRA into an FSDP-sharded model: each rank holds only shards of the base weights, so "
                    "the merge fails or writes wrong weights (peft: merging with FSDP is unsupported). Save the "
                    "adapter and merge offline on an unsharded model.",
                )
