from fsdplint.analysis import TRANSPARENT
from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._wrapped import fsdp_state, under_context

YAML_FSDP2 = """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
num_processes: 8
"""


class GenerateUnderFsdp(Rule):
    code = "FSDP108"
    name = "generate-under-fsdp"
    severity = Severity.ERROR
    summary = "`.generate()` on an FSDP-wrapped model without summon_full_params / register_fsdp_forward_method."
    sides = "S"
    doc = """
    ## What it does
    Finds `model.generate(...)` on a model wrapped with `FullyShardedDataParallel` or `fully_shard` (or
    prepared by accelerate under an FSDP config), outside `FSDP.summon_full_params(...)` and without
    `register_fsdp_forward_method(model, "generate")`.

    ## Why is this bad?
    FSDP gathers the full parameters only around `forward()`. `generate()` is another method: under FSDP1
    it reaches the inner module and runs with flat shards (`RuntimeError: 'weight' must be 2-D`); under
    FSDP2 the root's parameters stay sharded DTensors. When ranks take different code paths it hangs.

    ## Example
    ```python
    model = FSDP(model)
    out = model.generate(**inputs)
    ```

    ## Use instead
    ```python
    with FSDP.summon_full_params(model, writeback=False, recurse=False):
        out = model.generate(**inputs)  # on every rank
    ```
    FSDP2: `register_fsdp_forward_method(model, "generate")` once after `fully_shard`.

    ## Fix safety
    No automatic fix: the right wrapper depends on the FSDP version and must run on all ranks; the
    message names it.

    ## Versions
    All versions.

    ## References
    - pytorch#100069, #124019; transformers#30228; trl#1726; accelerate#3825
    """
    references = ("pytorch#100069", "pytorch#124019", "trl#1726", "accelerate#3825")

    VALID = [
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, use_orig_params=True)
        with FSDP.summon_full_params(model, writeback=False, recurse=False):
            out = model.generate(**inputs)
        """,
        # The gathering context through a lambda (HALOs' trainers: FSDP or not, one code path).
        """
        import contextlib
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        class Trainer:
            def __init__(self, policy, fsdp):
                self.fsdp = fsdp
                self.policy = FSDP(policy, use_orig_params=True)

            def sample(self, batch):
                ctx = lambda: (FSDP.summon_full_params(self.policy, writeback=False, recurse=False) if self.fsdp
                               else contextlib.nullcontext())
                with ctx():
                    return self.policy.generate(batch["prompt_input_ids"])
        """,
        """
        from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        register_fsdp_forward_method(model, "generate")
        out = model.generate(**inputs)
        """,
        # Generation before wrapping (e.g. a baseline sample) is fine.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        sample = model.generate(**inputs)
        model = FSDP(model)
        """,
        # trl's helper gathers the weights.
        """
        from trl.models import unwrap_model_for_generation
        from accelerate import Accelerator
        accelerator = Accelerator()
        model = accelerator.prepare(model)
        with unwrap_model_for_generation(model, accelerator) as unwrapped:
            out = unwrapped.generate(**inputs)
        """,
        # The inner decoder is wrapped; the outer model's forward reaches it through FSDP (llm-foundry's tests).
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model.model = FSDP(model.model)
        out = model.generate(input_ids, max_new_tokens=3, synced_gpus=True)
        """,
        # Generation only in the branch that does not wrap.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        if args.fsdp:
            model = FSDP(model, device_id=local_rank)
        train(model)
        if not args.fsdp:
            out = model.generate(**inputs)
        """,
    ]
    INVALID = [
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(model, auto_wrap_policy=policy)
            out = model.generate(**inputs)
            """,
            line=3,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as f

            def evaluate(model, batch):
                return model.module.generate(**batch, max_new_tokens=32)

            def main(model, batch):
                for layer in model.model.layers:
                    f.fully_shard(layer)
                f.fully_shard(model)
                return evaluate(model, batch)
            """,
            line=4,
        ),
        Invalid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, opt = accelerator.prepare(model, opt)
            text = model.generate(input_ids, max_new_tokens=64)
            """,
            line=4,
            options={"accelerate_config": YAML_FSDP2},
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        registered = bool(a.calls("register_fsdp_forward_method"))
        for t in a.timelines:
            for ev in t.of("generate"):
                if ev.ref is not None and ev.ref.child:
                    continue
                state = fsdp_state(a, t, ev)
                if state is None or under_context(a, ev, "summon_full_params", "unwrap_model_for_generation"):
                    continue
                if _inner_module_wrapped(t, ev):
                    continue
                if state == "fsdp2":
                    if registered:
                        continue
                    hint = 'call register_fsdp_forward_method(model, "generate") after fully_shard'
                else:
                    hint = "run it inside `with FSDP.summon_full_params(model, writeback=False, recurse=False):` on every rank"
                ctx.report(
                    ev.node,
                    "generate() on an FSDP-sharded model: FSDP gathers parameters only around forward(), so generation "
                    f"runs on shards ('weight' must be 2-D) or hangs. Gather first: {hint}.",
                )


def _inner_module_wrapped(t, ev) -> bool:
    """`model.model = FSDP(model.model)` then `model.generate(...)`: the outer model's forward calls the wrapped
    inner module through FSDP, which gathers its parameters."""
    outer = ev.ref.path if ev.ref is not None else None
    wraps = [w for w in t.before(ev, ("wrap1", "shard2")) if w.ref is not None]
    if outer is None or not wraps:
        return False
    for w in wraps:
        inner = tuple(p for p in w.ref.path if p not in TRANSPARENT)
        if w.ref.path[: len(outer)] != outer or len(inner) <= len([p for p in outer if p not in TRANSPARENT]):
            return False
    return True
