from fsdplint.findings import Severity
from fsdplint.rule import Invalid, Rule


class SyntaxErrorRule(Rule):
    code = "FSDP900"
    name = "syntax-error"
    severity = Severity.ERROR
    summary = "The file does not parse as Python, so no other rule could check it."
    doc = """
    ## What it does
    Reports a file that libcst cannot parse (a syntax error, a null byte, nesting too deep to parse).

    ## Why is this bad?
    A script that does not parse cannot run, and fsdplint cannot check it for the FSDP bugs it looks for.

    ## Example
    ```python
    model = FullyShardedDataParallel(model,
    ```

    ## Use instead
    Fix the syntax error at the reported line and column.

    ## Fix safety
    No fix.

    ## Versions
    All versions.

    ## References
    - https://docs.python.org/3/reference/grammar.html
    """
    VALID = ["import torch\nx = 1\n", "", "# only a comment\n"]
    INVALID = [
        Invalid("model = FullyShardedDataParallel(model,\n", line=1),
        Invalid("def f(:\n    pass\n", line=1),
        Invalid("import peft\nx = = 1\n", line=2),
    ]
