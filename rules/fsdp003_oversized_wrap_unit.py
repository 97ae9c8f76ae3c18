from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid

# FullyShardedDataParallel(module, process_group, sharding_strategy, cpu_offload, auto_wrap_policy, ...)
_POLICY_POSITION = 4

# A non-root unit holding more than this share of all parameters defeats sharding.
MAX_UNIT_SHARE = 0.5


class OversizedWrapUnit(Rule):
    code = "FSDP003"
    name = "oversized-wrap-unit"
    severity = Severity.WARNING
    summary = "FSDP1 without an auto-wrap policy, or a policy that matches nothing: the whole model is one unit"
    sides = "SA"
    doc = """
    ## What it does
    Finds FSDP plans where one unit holds most of the model: FSDP1 without an auto-wrap policy, a policy
    whose classes match no module (e.g. `modules_to_save` wrappers that fail a class match), or a wrap
    class that is a container of the whole model.

    The static side reports only models it knows to be large: loaded from a pretrained checkpoint
    (`from_pretrained`) in the script. A model built in code (a small test model) or of unknown origin is
    left to the model audit (`fsdplint model`), which knows the sizes.

    ## Why is this bad?
    A unit is all-gathered as a whole for its forward and backward: with one giant unit each rank holds
    the full model during compute and FSDP saves nothing. It usually ends in an out-of-memory error.

    ## Example
    ```python
    model = FSDP(model)  # no auto_wrap_policy
    ```

    ## Use instead
    ```python
    policy = ModuleWrapPolicy({LlamaDecoderLayer})
    model = FSDP(model, auto_wrap_policy=policy)
    ```

    ## Fix safety
    No automatic fix.

    ## Versions
    All versions.

    ## References
    - verl#5516
    - torch `_fully_shard.py` docstring
    """
    VALID = [
        """
        import functools
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
        model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
        """,
        """
        import torch.distributed.fsdp as f
        from peft.utils.other import fsdp_auto_wrap_policy
        model = f.FullyShardedDataParallel(model, auto_wrap_policy=fsdp_auto_wrap_policy(model))
        """,
        # Manual nested wrapping: each layer is its own unit.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        for i, layer in enumerate(model.model.layers):
            model.model.layers[i] = FSDP(layer)
        model = FSDP(model)
        """,
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import enable_wrap, wrap
        with enable_wrap(wrapper_cls=FSDP):
            for block in blocks:
                wrap(block)
            model = FSDP(model)
        """,
        # A toy model in a test: one unit is fine, and its size is known only to the audit.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def test_fsdp_wrap():
            model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
            model = FSDP(model, auto_wrap_policy=None, use_orig_params=True)
            model(torch.randn(2, 64)).sum().backward()
        """,
        # The kwargs are built elsewhere: unknown, so silent.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, **get_fsdp_kwargs(cfg))
        """,
    ]
    VALID += [
        Valid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            options={"accelerate_config": (
                "distributed_type: FSDP\n"
                "fsdp_config:\n"
                "  fsdp_version: 1\n"
                "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n"
            )},
        ),
    ]
    INVALID = [
        Invalid(
            """
            from accelerate import Accelerator
            accelerator = Accelerator()
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            options={"accelerate_config": (
                "distributed_type: FSDP\n"
                "fsdp_config:\n"
                "  fsdp_version: 1\n"
                "  fsdp_auto_wrap_policy: NO_WRAP\n"
                "  fsdp_use_orig_params: true\n"
            )},
            line=4,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")
            model = FSDP(model, use_orig_params=True, device_id=local_rank)
            """,
            line=4,
        ),
        Invalid(
            """
            import torch.distributed.fsdp as f
            from peft import get_peft_model as add_lora
            from transformers import AutoModelForCausalLM

            def build(name, cfg):
                model = AutoModelForCausalLM.from_pretrained(name)
                model = add_lora(model, cfg)
                kwargs = {"use_orig_params": True, "auto_wrap_policy": None}
                return f.FullyShardedDataParallel(model, **kwargs)
            """,
            line=9,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel
            from transformers import AutoModelForCausalLM

            class Runner:
                def setup(self):
                    self.model = AutoModelForCausalLM.from_pretrained(self.name)
                    self.model = FullyShardedDataParallel(self.model, sync_module_states=True)
            """,
            line=7,
        ),
    ]

    AUDIT_VALID = [spec(fsdp={"version": 1, "use_orig_params": True}), spec()]
    AUDIT_INVALID = [
        spec(fsdp={"version": 1, "auto_wrap_policy": "NO_WRAP", "use_orig_params": True}),
        spec(fsdp={"version": 1, "wrap": ["NoSuchDecoderLayer"], "use_orig_params": True}),
        spec(fsdp={"wrap": ["LlamaModel"]}),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        setting = _launch_no_wrap(a, 1)
        if setting is not None:
            ctx.report_setting(
                setting,
                "The FSDP1 launch config sets auto_wrap_policy NO_WRAP: the whole model is one FSDP unit, "
                "all-gathered whole for every forward and backward, so each rank peaks at the full model size. "
                "Use TRANSFORMER_BASED_WRAP (with transformer_layer_cls_to_wrap set to the decoder layer class).",
            )
        if a.calls("fsdp_wrap", "enable_wrap"):
            return  # manual wrapping of submodules
        roots = [e for e in a.events("wrap1") if e.ref is not None and not e.ref.child and e.entity]
        root_calls = {id(e.call.node) for e in roots}
        if any(id(c.node) not in root_calls for c in a.calls("FSDP1")) or len({e.entity for e in roots}) > 1:
            return  # some submodule is wrapped by hand (or we cannot tell what is)
        for t in a.timelines:
            for ev in t.of("wrap1"):
                if ev.ref is None or ev.ref.child or ev.entity is None or t.of("wrap1", ev.entity)[0] is not ev:
                    continue
                call = ev.call
                kws = a.keywords(call)
                positional = [x for x in call.node.args if x.keyword is None and not x.star]
                if kws is None or len(positional) > _POLICY_POSITION:
                    continue
                policy = kws.get("auto_wrap_policy")
                if policy is not None and a.value(policy, call.scope) is not None:
                    continue
                if t.escapes(ev.entity, ev):
                    continue
                if not _pretrained(a, t, ev.entity):
                    continue  # size unknown (a toy model in a test, a model built elsewhere): the audit knows sizes
                ctx.report(
                    call.node,
                    "FullyShardedDataParallel wraps the model without an auto_wrap_policy and no submodule is "
                    "wrapped by hand: the whole model is one FSDP unit, all-gathered whole for every forward and "
                    "backward, so each rank peaks at the full model size. Pass auto_wrap_policy="
                    "ModuleWrapPolicy({<the decoder layer class>}) (for LoRA, peft's fsdp_auto_wrap_policy(model)).",
                )

    def audit(self, ctx):
        plan = ctx.plan
        total = sum(p.numel for p in ctx.params) or 1
        if plan.version == 1 and len(plan.units) == 1:
            why = (f"the wrap classes {plan.wrap_unmatched} match no module of {ctx.built.architecture}"
                   if plan.wrap_unmatched else f"the auto-wrap policy ({plan.policy}) selects no module")
            ctx.report(self, f"the FSDP1 plan has a single unit, the root ({why}): all {total:,} parameters "
                             f"are all-gathered together. Pass auto_wrap_policy=ModuleWrapPolicy("
                             f"{{{', '.join(ctx.built.no_split_modules) or 'the transformer block class'}}}).",
                       field="fsdp")
            return
        for unit in plan.units:
            if unit.name and unit.numel > MAX_UNIT_SHARE * total:
                ctx.report(self, f"FSDP unit {unit.label} ({unit.cls}) holds {unit.numel:,} of {total:,} "
                                 f"parameters ({100 * unit.numel / total:.0f}%): it is all-gathered as a whole, "
                                 f"so sharding saves little. Wrap smaller modules (the transformer blocks).",
                           unit=unit.name, field="fsdp.wrap")


def _pretrained(a, t, entity) -> bool:
    """The wrapped model was loaded from a pretrained checkpoint in this timeline (`from_pretrained`): a model
    known to be large. Models built in code (a 64x64 toy in a test) or of unknown origin are left to the audit."""
    for step in t.steps:
        call = step.call
        if call is None or call.api != "load_model" or "from_pretrained" not in (call.qualname or ""):
            continue
        for tg in a.result_targets(call):
            d = dotted(tg)
            if d and t.find(a._target_key(step, d)) == entity:
                return True
    return False


def _launch_no_wrap(a, version):
    """The launch config's `auto_wrap_policy: NO_WRAP` setting for this FSDP version, if nothing else wraps."""
    launch = getattr(a, "launch", None)
    if launch is None or launch.fsdp_version != version:
        return None
    s = launch.get("auto_wrap_policy")
    if s is None or str(s.value).strip().upper() != "NO_WRAP":
        return None
    if launch.value("transformer_layer_cls_to_wrap") or launch.value("min_num_params"):
        return None  # TrainingArguments turn these into a wrap policy
    return s
