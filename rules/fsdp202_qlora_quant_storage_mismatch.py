from fsdplint.audit.examples import spec
from fsdplint.audit.params import dtype_name
from fsdplint.findings import Applicability, Severity
from fsdplint.rule import Rule


class QloraQuantStorageMismatch(Rule):
    code = "FSDP202"
    name = "qlora-quant-storage-mismatch"
    severity = Severity.ERROR
    summary = (
        "FSDP1 QLoRA without `bnb_4bit_quant_storage` equal to the model dtype (uint8 default cannot be "
        "flattened)"
    )
    sides = "SA"
    fix = Applicability.UNSAFE
    versions = {"bitsandbytes": ">=0.43.0"}
    doc = """
    ## What it does
    Computes the FSDP1 flat parameters of a 4-bit model with the dtype the loaded weights will have
    (`bnb_4bit_quant_storage`, uint8 by default) and runs FSDP1's own flattening checks on each unit.

    ## Why is this bad?
    A `FlatParameter` needs one floating dtype. With the default uint8 storage FSDP1 raises `ValueError:
    Cannot flatten integer dtype tensors` or `Must flatten tensors with uniform dtype but got
    torch.bfloat16 and torch.uint8`; a storage dtype different from the model dtype fails the same way.

    ## Example
    ```python
    BitsAndBytesConfig(load_in_4bit=True)  # + FSDP1
    ```

    ## Use instead
    ```python
    BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
    AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, quantization_config=bnb_config)
    ```

    ## Fix safety
    Unsafe: the storage dtype must equal the load dtype, which the fix cannot always see.

    ## Versions
    `bnb_4bit_quant_storage` exists from bitsandbytes 0.43.0.

    ## References
    - bitsandbytes docs fsdp_qlora.md; bnb#970
    - peft docs accelerate/fsdp.md; peft#1432; axolotl#1494; trl#1723
    """
    AUDIT_VALID = [
        spec(quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"},
             fsdp={"version": 1, "auto_wrap_policy": "peft"}),
    ]
    AUDIT_INVALID = [
        spec(quantization={"load_in_4bit": True}, fsdp={"version": 1, "auto_wrap_policy": "peft"}),
        spec(quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "float32"},
             fsdp={"version": 1, "auto_wrap_policy": "peft"}),
    ]

    def audit(self, ctx):
        if ctx.plan.version != 1:
            return
        storage = ctx.built.quant_storage
        for message, unit, _ in ctx.problems(self.code):
            ctx.report(self, f"FSDP1 would raise ValueError: {message}. The 4-bit weights are stored as "
                             f"{dtype_name(storage)}; set bnb_4bit_quant_storage={dtype_name(ctx.built.dtype)} "
                             f"(the model dtype) so every flat parameter has one floating dtype.",
                       unit=unit, field="quantization")
