from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.rule import Rule


class Fsdp2Shards4bitBase(Rule):
    code = "FSDP201"
    name = "fsdp2-shards-4bit-base"
    severity = Severity.ERROR
    summary = "FSDP2 shards bitsandbytes Params4bit base weights (silent QLoRA corruption / errors)"
    sides = "SA"
    versions = {"torch": ">=2.4", "bitsandbytes": "<=0.50"}
    doc = """
    ## What it does
    Finds bitsandbytes `Params4bit` weights (QLoRA base weights) inside an FSDP2 unit that are not in
    `ignored_params`.

    ## Why is this bad?
    bitsandbytes has no FSDP2 all-gather extension: `fully_shard` turns each `Params4bit` into a plain
    dim-0 `DTensor` and its `quant_state` is lost. With uint8 storage it fails (`only Tensors of floating
    point dtype can require gradients`, loss 0.0, NaN grad norm); with float storage it fails silently —
    wrong forward, "little to no memory savings". `fully_shard` accepts such a model without a word.

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained(name, quantization_config=BitsAndBytesConfig(load_in_4bit=True))
    model = get_peft_model(model, lora_config)
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)
    ```

    ## Use instead
    ```python
    frozen_4bit = {p for p in model.parameters() if type(p).__name__ == "Params4bit"}
    fully_shard(layer, ignored_params=frozen_4bit)  # torch >= 2.7; base weights are replicated
    ```
    or FSDP1 with `bnb_4bit_quant_storage` equal to the model dtype (see FSDP202), or torchao NF4.

    ## Fix safety
    No automatic fix.

    ## Versions
    torch >= 2.4, bitsandbytes <= 0.50; accelerate >= 1.14 ignores frozen Params4bit automatically.

    ## References
    - accelerate#3983, accelerate#3987, bnb#1945, bnb#1719
    - axolotl#2992, trl#6343, torchtune#909
    """
    AUDIT_VALID = [
        spec(quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"},
             fsdp={"ignored_params": "4bit"}),
        spec(quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"},
             fsdp={"version": 1, "auto_wrap_policy": "peft"}),
    ]
    AUDIT_INVALID = [
        spec(quantization={"load_in_4bit": True}),
        spec(quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"}),
    ]

    def audit(self, ctx):
        ctx.report_problems(self)
        plan = ctx.plan
        if plan.version != 2:
            return
        hits = [(u, p) for u in plan.units for p in u.params if p.kind == "4bit" and not p.ignored]
        if not hits:
            return
        units = sorted({u.label for u, _ in hits})
        fix = ("pass the frozen Params4bit as fully_shard(..., ignored_params=...) (torch >= 2.7; the base "
               "weights are then replicated, not sharded)" if ctx.torch_at_least("2.7") else
               "use FSDP1 with bnb_4bit_quant_storage equal to the model dtype (ignored_params needs "
               "torch >= 2.7)")
        ctx.report(self, f"{len(hits)} bitsandbytes Params4bit base weight(s) in {len(units)} FSDP2 unit(s) "
                         f"(e.g. {hits[0][1].fqn} in {hits[0][0].label}) are sharded as plain DTensors: "
                         f"bitsandbytes has no FSDP2 support, so quant_state is lost and QLoRA silently "
                         f"trains on garbage or fails. Instead, {fix}.",
                   unit=hits[0][0].name, param=hits[0][1].fqn, field="quantization")
