from fsdplint.findings import Severity
from fsdplint.rule import Rule


class JobRaised(Rule):
    code = "FSDP904"
    name = "job-raised"
    severity = Severity.ERROR
    sides = "R"
    summary = "Under `fsdplint run`, the job raised an exception no rule explains (quoted, at the job's own line)."
    doc = """
    ## What it does
    `fsdplint run` executes the job's real launch in a dry-run world (a fake process group of N ranks, models
    on the meta device). When the job raises before its first training step and the error text matches no
    rule, this finding quotes the exception, names the rank, and points at the deepest frame of the job's own
    files in the traceback. A rank that does not reach its step within `--timeout` is reported here too.

    ## Why is this bad?
    The same launch on the cluster would very likely raise the same error, after the model download and load.

    ## Example
    `fsdplint run -- torchrun --nproc_per_node 8 train.py --model_dir ./model` where `train.py` reads a
    key its config does not have: `KeyError: 'lora_rank'` at `train.py:42`.

    ## Use instead
    Fix the error at the reported line and run again. An error that the dry run itself causes (code that
    needs real weight values) is named as such in the message.

    ## Fix safety
    No fix.

    ## Versions
    All versions.

    ## References
    - `fsdplint run --help`
    """
