"""The optional dependencies a command needs, checked before it starts: a missing one is one line
with the pip command that installs it, never a traceback or an internal-error finding."""

from __future__ import annotations

import importlib

from fsdplint.errors import UsageError

# What the model audit imports (the `[model]` extra), in the order they are needed.
MODEL_MODULES = ("torch", "transformers", "peft", "accelerate")


def require(what: str, modules=MODEL_MODULES, extra: str = "model") -> None:
    """Raise a one-line UsageError when one of `modules` cannot be imported."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            missing = getattr(e, "name", None) or name
            raise UsageError(f"{what} needs the {extra} extra ({missing} is not installed): "
                             f"pip install 'fsdplint[{extra}]' (from a checkout: pip install -e '.[{extra}]')") from None
