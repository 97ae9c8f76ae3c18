"""Where the dry run stops: the first training forward after the model is wrapped (or an optimizer
exists), or the first `optimizer.step()`, whichever comes first.

Meta tensors have no data, so the forward itself is not executed: FSDP2 refuses meta parameters at
its lazy init, and the ops that read values (masks, `.item()`) cannot run. Everything the job does
before that point — argument parsing, model build, quantization, LoRA injection, the wrap, the
optimizer — is the real code.
"""

from __future__ import annotations

import weakref


class ReachedStop(BaseException):
    """Raised at the stop point; a BaseException so a job's `except Exception` does not swallow it."""

    def __init__(self, point: str, model=None):
        super().__init__(point)
        self.point = point
        self.model = model


class Progress:
    """What the job reached, recorded by the hooks."""

    def __init__(self):
        self.points: list[str] = []
        self.wrapped: list = []  # weakrefs to modules the job wrapped
        self.optimizers: list = []  # weakrefs to optimizers the job built
        self.armed = False
        self.notes: set = set()
        self.on_stop = None  # callback(point, model, optimizer) -> None, run before ReachedStop

    def reach(self, point: str) -> None:
        if point not in self.points:
            self.points.append(point)

    @property
    def last(self) -> str:
        return self.points[-1] if self.points else "start"

    def optimizer(self):
        for ref in reversed(self.optimizers):
            opt = ref()
            if opt is not None:
                return opt
        return None

    def wrapped_model(self):
        for ref in self.wrapped:
            m = ref()
            if m is not None:
                return m
        return None


PROGRESS = Progress()


def install() -> None:
    """Global hooks: optimizer construction and step, module forward."""
    import torch
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    init = torch.optim.Optimizer.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if not any(r() is self for r in PROGRESS.optimizers):
            PROGRESS.optimizers.append(weakref.ref(self))
            PROGRESS.reach("optimizer")
            PROGRESS.armed = True

    torch.optim.Optimizer.__init__ = recording_init

    def before_step(optimizer, args, kwargs):
        _stop("step", PROGRESS.wrapped_model(), optimizer)

    register_optimizer_step_pre_hook(before_step)

    def before_forward(module, args):
        if PROGRESS.armed:
            _stop("forward", module, PROGRESS.optimizer())

    register_module_forward_pre_hook(before_forward)


def note_wrap(module) -> None:
    PROGRESS.wrapped.append(weakref.ref(module))
    PROGRESS.reach("wrap")
    PROGRESS.armed = True


def _stop(point: str, model, optimizer) -> None:
    PROGRESS.armed = False  # the checks below may call modules themselves
    PROGRESS.reach(point)
    if PROGRESS.on_stop is not None:
        PROGRESS.on_stop(point, model, optimizer)
    raise ReachedStop(point, model)
