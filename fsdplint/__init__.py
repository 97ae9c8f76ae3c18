"""fsdplint: find FSDP + LoRA/QLoRA bugs before the job is launched.

Importing this package is cheap: the static linter, the model audit and the
runtime guard are loaded only when used.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "check", "guard", "FSDPLintError"]


def __getattr__(name):
    # Lazy so `import fsdplint` never pulls torch onto the static path.
    if name == "check":
        from fsdplint.runtime.check import check

        return check
    if name == "FSDPLintError":
        from fsdplint.runtime.check import FSDPLintError

        return FSDPLintError
    if name == "guard":
        from fsdplint.runtime import guard

        return guard
    raise AttributeError(f"module 'fsdplint' has no attribute {name!r}")
