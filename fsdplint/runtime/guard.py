"""Run `fsdplint.check` from HF Trainer or accelerate, right before the first step.

    fsdplint.guard.attach(trainer)                          # HF Trainer / TRL trainers
    model, opt = fsdplint.guard.prepare(accelerator, model, opt)   # accelerate
"""

from __future__ import annotations

import functools

from fsdplint.runtime.check import check

__all__ = ["FSDPLintCallback", "attach", "prepare"]


def attach(trainer, **check_kwargs):
    """Add a callback that checks the wrapped model and optimizer in `on_train_begin`."""
    trainer.add_callback(_callback_class()(trainer=trainer, **check_kwargs))
    return trainer


def prepare(accelerator, *objects, **check_kwargs):
    """`accelerator.prepare(*objects)`, then check the prepared model and optimizer."""
    from torch import nn

    prepared = accelerator.prepare(*objects)
    items = prepared if isinstance(prepared, tuple) else (prepared,)
    models = [o for o in items if isinstance(o, nn.Module)]
    optimizers = [o for o in items if hasattr(o, "param_groups") and not isinstance(o, nn.Module)]
    if len(models) == 1:
        check(models[0], optimizers[0] if len(optimizers) == 1 else None, **check_kwargs)
    return prepared


@functools.lru_cache(maxsize=None)
def _callback_class():
    from transformers import TrainerCallback

    class FSDPLintCallback(TrainerCallback):
        """Runs `fsdplint.check` on every rank in `on_train_begin` (after Trainer wrapped the model).

        Give it the trainer (`fsdplint.guard.attach(trainer)` does): the model and
        optimizer Trainer passes to callbacks are the unwrapped model and, in
        recent transformers, no optimizer at all.
        """

        def __init__(self, trainer=None, **check_kwargs):
            self.trainer = trainer
            self.check_kwargs = check_kwargs
            self.findings = None

        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            if self.trainer is not None:
                model = getattr(self.trainer, "model_wrapped", None) or self.trainer.model
                optimizer = self.trainer.optimizer
            self.findings = check(model, optimizer, **self.check_kwargs)
            return control

    return FSDPLintCallback


def __getattr__(name):
    if name == "FSDPLintCallback":
        return _callback_class()
    raise AttributeError(f"module 'fsdplint.guard' has no attribute {name!r}")
