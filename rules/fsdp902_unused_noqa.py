from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule


class UnusedNoqa(Rule):
    code = "FSDP902"
    name = "unused-noqa"
    severity = Severity.INFO
    summary = "A `# noqa` comment names fsdplint codes that report nothing on its line."
    doc = """
    ## What it does
    Reports `# noqa: FSDPxxx` comments whose fsdplint codes suppress no finding on that line
    (codes of other linters are left alone).

    ## Why is this bad?
    A stale suppression hides the next real bug on that line and misleads readers.

    ## Example
    ```python
    model = get_peft_model(model, cfg)  # noqa: FSDP101
    ```
    where nothing is wrapped before.

    ## Use instead
    Remove the comment, or the codes that no longer apply.

    ## Fix safety
    No fix.

    ## Versions
    All versions.

    ## References
    - ruff's RUF100 (unused-noqa)
    """
    VALID = [
        "from peft import get_peft_model\nmodel = get_peft_model(model, cfg)  # noqa: E501\n",
        "from peft import get_peft_model\nmodel = get_peft_model(model, cfg)  # noqa\n",
        "x = 1\n",
    ]
    INVALID = [
        Invalid("from peft import get_peft_model\nmodel = get_peft_model(model, cfg)  # noqa: FSDP101\n", line=2),
        Invalid("import torch\nx = 1  # noqa: FSDP101\n", line=2),
        Invalid("import peft\ny = 2  # noqa: FSDP101, E501\n", line=2),
    ]
