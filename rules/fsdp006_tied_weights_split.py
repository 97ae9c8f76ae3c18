from fsdplint.audit.examples import spec, tiny
from fsdplint.findings import Severity
from fsdplint.rule import Rule


class TiedWeightsSplit(Rule):
    code = "FSDP006"
    name = "tied-weights-split"
    severity = Severity.ERROR
    summary = "a tied/shared parameter lands in two FSDP units"
    sides = "A"
    versions = {"torch": ">=2.4"}
    doc = """
    ## What it does
    Finds shared parameters (tied input/output embeddings such as Qwen2's `embed_tokens.weight is
    lm_head.weight`) whose owning modules fall into different FSDP units.

    ## Why is this bad?
    A shared parameter must live in exactly one unit. FSDP2 (torch 2.13) raises at the first forward:
    `ValueError: Parameter 'model.embed_tokens.weight' is shared with a parameter already managed by
    another FSDP group. For shared/tied parameters, use fully_shard([module_a, module_b]) ...`; older
    releases silently all-gather it twice. FSDP1 flattens it into the first unit only and the other
    module reads a resharded view (size-mismatch errors).

    ## Example
    ```python
    fully_shard(model.model.embed_tokens)   # lm_head.weight is the same tensor
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    ```

    ## Use instead
    ```python
    fully_shard([model.model.embed_tokens, model.lm_head])
    ```
    or leave both in the root unit.

    ## Fix safety
    No automatic fix.

    ## Versions
    Hard error at lazy init in torch >= 2.13.

    ## References
    - accelerate#4171, lightning#21613, saforem2/ezpz#237
    - torchtitan `distributed/fsdp.py`
    """
    AUDIT_VALID = [spec("qwen2"), spec("qwen2", fsdp={"version": 1, "use_orig_params": True})]
    AUDIT_INVALID = [
        spec("qwen2", fsdp={"wrap": ["Qwen2DecoderLayer", "Embedding"]}),
        spec("qwen2", fsdp={"version": 1, "use_orig_params": True, "wrap": ["Qwen2DecoderLayer", "Embedding"]}),
        spec(model=tiny("llama", tie_word_embeddings=True), fsdp={"wrap": ["LlamaDecoderLayer", "Embedding"]}),
    ]

    def audit(self, ctx):
        ctx.report_problems(self)
        plan = ctx.plan
        for info, units in plan.split_shared:
            names = " and ".join([info.fqn, *info.aliases])
            if plan.version == 2:
                effect = ("torch >= 2.13 raises ValueError at the first forward: \"Parameter '{0}' is shared "
                          "with a parameter already managed by another FSDP group\"; older releases "
                          "all-gather it twice".format(info.fqn))
            else:
                effect = (f"FSDP1 flattens it into {units[0]} only, and {units[1]} then reads a resharded "
                          f"view (size mismatch)")
            ctx.report(self, f"shared parameter {names} is managed by {len(units)} FSDP units "
                             f"({', '.join(units)}): {effect}. Shard the modules that share it together, "
                             f"e.g. fully_shard([embed_tokens, lm_head]), or leave both in the root unit.",
                       param=info.fqn, unit=units[0], field="fsdp.wrap")
