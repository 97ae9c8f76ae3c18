from fsdplint.analysis import QName
from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._checkpointing import hf_checkpointing

YAML_FSDP1 = """\
distributed_type: FSDP
fsdp_config:
  fsdp_version: 1
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
num_processes: 8
"""
YAML_GRAD_OP = YAML_FSDP1.replace("FULL_SHARD", "SHARD_GRAD_OP")
YAML_FSDP2 = YAML_FSDP1.replace("fsdp_version: 1", "fsdp_version: 2").replace("  fsdp_sharding_strategy: FULL_SHARD\n", "")

# Strategies that free the parameters after forward, so a recompute outside FSDP's hooks all-gathers again.
_RESHARDING = ("FULL_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")


class HfCheckpointingUnderFsdp(Rule):
    code = "FSDP106"
    name = "hf-checkpointing-under-fsdp"
    severity = Severity.WARNING
    summary = "HF `gradient_checkpointing=True` under FSDP instead of FSDP activation checkpointing."
    sides = "S"
    doc = """
    ## What it does
    Finds Hugging Face gradient checkpointing (`model.gradient_checkpointing_enable()`,
    `TrainingArguments(gradient_checkpointing=True)`) in a script that runs under FSDP1 with a resharding
    strategy (`FULL_SHARD`, the default, or `HYBRID_SHARD`): a `FullyShardedDataParallel` call, an
    accelerate FSDP config, or `TrainingArguments(fsdp=...)`.

    ## Why is this bad?
    Hugging Face checkpointing recomputes each decoder layer outside FSDP's own activation-checkpointing
    integration. Under `FULL_SHARD` the layer's parameters were freed after forward, so the recompute
    triggers an extra all-gather in backward on top of the one FSDP already does: more communication
    for the same memory saving. transformers itself warns about this combination (transformers#31578).

    ## Example
    ```python
    TrainingArguments(fsdp="full_shard auto_wrap", gradient_checkpointing=True)
    ```

    ## Use instead
    ```python
    TrainingArguments(fsdp="full_shard auto_wrap", fsdp_config={"activation_checkpointing": True})
    ```
    or `fsdp_activation_checkpointing: true` in the accelerate config.

    ## Fix safety
    No automatic fix: moving checkpointing into the FSDP config changes which modules are wrapped and
    must be combined with `use_cache=False` (FSDP107).

    ## Versions
    All versions; transformers warns from transformers#31578 on.

    ## References
    - transformers#30404, #31578
    """
    references = ("transformers#30404", "transformers#31578")

    VALID = [
        """
        from transformers import TrainingArguments
        args = TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap",
                                 fsdp_config={"activation_checkpointing": True})
        """,
        # No FSDP: plain DDP or single GPU.
        """
        from transformers import TrainingArguments
        args = TrainingArguments(output_dir="out", gradient_checkpointing=True)
        """,
        # SHARD_GRAD_OP keeps the parameters gathered between forward and backward.
        Valid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model.gradient_checkpointing_enable()
            model = accelerator.prepare(model)
            """,
            options={"accelerate_config": YAML_GRAD_OP},
        ),
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        model.gradient_checkpointing_enable()
        model = FSDP(model, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)
        """,
        # gradient_checkpointing explicitly off.
        """
        from transformers import TrainingArguments
        args = TrainingArguments(output_dir="out", fsdp="full_shard", gradient_checkpointing=False)
        """,
        # FSDP2 (fully_shard) reshards per module through its own hooks; not reported.
        Valid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model.gradient_checkpointing_enable()
            model = accelerator.prepare(model)
            """,
            options={"accelerate_config": YAML_FSDP2},
        ),
    ]
    INVALID = [
        Invalid(
            """
            from transformers import TrainingArguments
            args = TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap", gradient_checkpointing=True)
            """,
            line=2,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as f
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model = f.FullyShardedDataParallel(model, auto_wrap_policy=policy)
            """,
            line=2,
        ),
        Invalid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model.gradient_checkpointing_enable()
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            line=3,
            options={"accelerate_config": YAML_FSDP1},
        ),
        Invalid(
            """
            from trl import SFTConfig as Config
            args = Config(
                output_dir="out",
                gradient_checkpointing=True,
                fsdp="full_shard auto_wrap",
                fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
            )
            """,
            line=4,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        launch = _launch_resharding(a)
        raw = _raw_resharding_calls(a)
        if not launch and not raw:
            return
        for site in hf_checkpointing(a):
            if not launch and not (site.call.seq in raw):
                continue  # a raw FSDP1 wrap of some other model
            ctx.report(
                site.node,
                "Hugging Face gradient checkpointing under FSDP FULL_SHARD recomputes each layer outside FSDP's "
                "hooks, so backward all-gathers the layer's parameters a second time. Use FSDP activation "
                "checkpointing instead (fsdp_config activation_checkpointing: true / fsdp_activation_checkpointing) "
                "and set model.config.use_cache = False.",
            )


def _launch_resharding(a) -> bool:
    """An FSDP1 launch config with a strategy that frees parameters after forward (FULL_SHARD is the default)."""
    launch = getattr(a, "launch", None)
    if launch is not None and launch.fsdp_version == 1:
        s = launch.get("sharding_strategy")
        strategy = _strategy_name(s.value) if s is not None else None
        if strategy is None:
            sharding = launch.get("sharding")
            if sharding is not None and isinstance(sharding.value, str):
                words = sharding.value.upper().split()
                strategy = next((w for w in words if w in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")), None)
                if strategy == "HYBRID_SHARD_ZERO2":
                    strategy = "_HYBRID_SHARD_ZERO2"
            elif sharding is not None and s is None:
                strategy = "FULL_SHARD"
        if strategy is None and (s is None or s.value is None):
            strategy = "FULL_SHARD"
        if strategy in _RESHARDING:
            return True
    return False


def _raw_resharding_calls(a) -> set:
    """Source positions of checkpointing calls on a model that a resharding FullyShardedDataParallel wraps."""
    out = set()
    for t in a.timelines:
        wrapped = set()
        for ev in t.of("wrap1"):
            c = ev.call
            expr = a.keyword(c, "sharding_strategy")
            if ev.entity is None or (ev.ref is not None and ev.ref.child):
                continue
            if expr is None or _strategy_name(a.value(expr, c.scope)) in _RESHARDING:
                wrapped.add(ev.entity)
        for ev in t.of("gc_enable"):
            if ev.entity in wrapped and ev.call is not None:
                out.add(ev.call.seq)
    return out


def _strategy_name(v):
    """`ShardingStrategy.FULL_SHARD`, "FULL_SHARD", "full_shard" or accelerate's 1 → FULL_SHARD."""
    if isinstance(v, QName):
        return str(v).rsplit(".", 1)[-1]
    if isinstance(v, int) and not isinstance(v, bool):
        return {1: "FULL_SHARD", 2: "SHARD_GRAD_OP", 3: "NO_SHARD", 4: "HYBRID_SHARD", 5: "_HYBRID_SHARD_ZERO2"}.get(v)
    if isinstance(v, str):
        name = v.strip().upper()
        if name[:1].isdigit():
            return _strategy_name(int(name[:1]))
        return name
    return None
