"""Import the model stack (torch, transformers, peft, bitsandbytes) offline and quietly.

The hub is switched offline *before* transformers is imported: the audit never
downloads weights or configs. bitsandbytes logs a harmless CPU-kernel warning at
import time on machines without its optional kernels; it is kept out of user output.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1", "TRANSFORMERS_VERBOSITY": "error"}
_QUIET_LOGGERS = ("bitsandbytes", "bitsandbytes.backends.cpu.ops", "peft", "accelerate")
_loaded = False


def load_stack() -> None:
    """Import torch/transformers/peft once, with the hub offline and bnb quiet."""
    global _loaded
    if _loaded:
        return
    for k, v in _OFFLINE.items():
        os.environ.setdefault(k, v)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    with quiet():
        import torch  # noqa: F401
        import transformers

        transformers.logging.set_verbosity_error()
        try:
            import bitsandbytes  # noqa: F401
        except Exception:  # not installed / broken: 4-bit audits report it when asked for
            pass
        import peft  # noqa: F401
    _loaded = True


@contextlib.contextmanager
def quiet():
    """Silence library warnings (deprecations, meta-device notes) during the build."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
