from fsdplint.findings import Severity
from fsdplint.rule import Rule


class InternalError(Rule):
    code = "FSDP901"
    name = "internal-error"
    severity = Severity.ERROR
    sides = "SA"
    summary = "A rule failed on this file (or model); the other rules still ran."
    doc = """
    ## What it does
    Reports that one rule raised an unexpected error on one file. The other rules and files are still checked.
    Run with `--show-internal-errors` (or `-v`) to print the traceback, and report it as a bug.

    ## Why is this bad?
    The failing rule did not check this file, so a bug it looks for may have gone unreported.

    ## Example
    (Depends on the bug in fsdplint.)

    ## Use instead
    Report the traceback; meanwhile `--ignore` the failing rule for this file if it blocks you.

    ## Fix safety
    No fix.

    ## Versions
    All versions.

    ## References
    - `fsdplint --show-internal-errors`
    """
