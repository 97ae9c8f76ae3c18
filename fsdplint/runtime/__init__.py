"""Runtime guard: `fsdplint.check(model, optimizer)` inside the real distributed job.

It inspects the wrapped model on every rank, exchanges one small per-rank
fingerprint, and reports with the same rule codes as the static and audit sides.
"""

from fsdplint.runtime.check import FSDPLintError, FSDPLintWarning, check

__all__ = ["FSDPLintError", "FSDPLintWarning", "check"]
