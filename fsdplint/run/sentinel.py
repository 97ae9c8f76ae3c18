"""Where the dry run stops: just before the job's first `optimizer.step()` runs.

The job trains the shrunk twin (see `twin`) on the CPU, so everything before the step is the real
code run for real: argument parsing, model build, quantization, LoRA injection, the wrap, the
optimizer, the first forward (FSDP2's lazy init included), the loss and its backward (gradient
reduce-scatter under the fake process group). A global optimizer step pre-hook stops it there,
after the runtime checks have looked at the live model, its gradients and the optimizer.

A model that could not be twinned stays on meta: it holds no values, so such a job stops at its
first training forward after the wrap instead (FSDP2 refuses meta parameters at its lazy init), as
the report says.
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
        self.batch: tuple = ()  # (micro-batch, sequence length) of the first training forward
        self.first_forward_seen = False
        self.forward_stack: list = []  # traceback.FrameSummary of the first training forward
        self.autocast_stop = False  # stopped at the first forward because it runs under CUDA autocast
        self.until = "step"  # `--until save`: the first step is checked, then the job runs on (see saving)
        self.stepped = False
        self.step_stack: list = []  # traceback.FrameSummary of the first optimizer step (`--until save`)
        self.after_step = None  # callback() -> None, once the first step is checked (`--until save`)

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
        """The outermost module the job wrapped (FSDP2 jobs shard each layer before the root): the
        one holding the most modules."""
        live = [m for m in (ref() for ref in self.wrapped) if m is not None]
        return max(live, key=lambda m: sum(1 for _ in m.modules()), default=None)


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
        if PROGRESS.until == "save":
            _checked_step(optimizer)
            return
        _stop("step", PROGRESS.wrapped_model(), optimizer)

    register_optimizer_step_pre_hook(before_step)

    def before_forward(module, args):
        if not PROGRESS.armed or PROGRESS.first_forward_seen:
            return
        if isinstance(module, torch.nn.Embedding) and args and hasattr(args[0], "shape"):
            # The token ids of the first training forward: its micro-batch and sequence length,
            # which the activation estimate of the real config uses.
            shape = tuple(args[0].shape)
            PROGRESS.batch = shape if len(shape) == 2 else (1, shape[-1]) if shape else ()
            PROGRESS.first_forward_seen = True
            PROGRESS.reach("forward")
            # Where the job called its first training forward: the line a job that never steps is
            # reported at (read once, so the cost is one stack walk).
            import traceback

            PROGRESS.forward_stack = traceback.extract_stack()
        if any(getattr(p, "_fsdplint_meta_model", False) for p in module.parameters(recurse=False)) \
                or _meta_root(module):
            _stop("forward", module, PROGRESS.optimizer())
        if PROGRESS.first_forward_seen and _cuda_autocast(torch) and not _autocast_emulated():
            # accelerate's / Trainer's mixed precision autocasts on "cuda"; the twin computes on the CPU,
            # where a CUDA autocast region casts nothing. Without the emulation of `autocast` the forward
            # would meet dtype mixes a GPU run never sees: rather than report an error the cluster would
            # not raise, the run stops at this forward, as a meta run does, and says why.
            PROGRESS.notes.add("the job's forward runs under CUDA autocast (mixed precision), which the CPU "
                               "cannot reproduce: the run stopped at its first training forward, so forward "
                               "and backward were not run")
            PROGRESS.autocast_stop = True
            _stop("forward", PROGRESS.wrapped_model() or module, PROGRESS.optimizer())

    register_module_forward_pre_hook(before_forward)


def _autocast_emulated() -> bool:
    from fsdplint.run import autocast

    return autocast.STATE["installed"]


def autocast_used(dtype) -> None:
    """The first call under CUDA autocast that the emulation cast (see `autocast`)."""
    name = str(dtype).replace("torch.", "")
    PROGRESS.notes.add(f"the job runs under CUDA autocast ({name}): the CPU applied CUDA autocast's op policy "
                       f"(matmuls, linears and attention in {name}; softmax, norms, exp/log and losses in float32), "
                       f"so forward and backward ran with the dtypes of a GPU run")


def autocast_unemulated(reason: str) -> None:
    """Where the emulation of CUDA autocast cannot give a GPU's dtypes: a run past its wrap stops here,
    as at a forward under autocast without the emulation, and says why; before the wrap the call runs
    as the CPU runs it."""
    if not PROGRESS.armed:
        return
    PROGRESS.notes.add(f"the job runs under CUDA autocast, and {reason}: the run stopped there, so what "
                       f"follows in forward and backward was not run")
    PROGRESS.autocast_stop = True
    _stop("forward", PROGRESS.wrapped_model(), PROGRESS.optimizer())


def _cuda_autocast(torch) -> bool:
    try:
        return bool(torch.is_autocast_enabled("cuda"))
    except (TypeError, RuntimeError):  # a torch without the per-device form
        return False


def _meta_root(module) -> bool:
    """A forward of a wrapped model that is still the real-size meta model (no twin was built)."""
    wrapped = PROGRESS.wrapped_model()
    if module is not wrapped:
        return False
    return any(getattr(p, "_fsdplint_meta_model", False) for p in module.parameters())


def note_wrap(module) -> None:
    PROGRESS.wrapped.append(weakref.ref(module))
    PROGRESS.reach("wrap")
    PROGRESS.armed = True


def _checked_step(optimizer) -> None:
    """`--until save`: the first step is checked as the stop would check it, then it runs, and so does
    the rest of the job (later steps are not checked)."""
    if PROGRESS.stepped:
        return
    import traceback

    PROGRESS.stepped = True
    PROGRESS.armed = False
    PROGRESS.reach("step")
    PROGRESS.step_stack = traceback.extract_stack()
    if PROGRESS.on_stop is not None:
        PROGRESS.on_stop("step", PROGRESS.wrapped_model(), optimizer)
    if PROGRESS.after_step is not None:
        PROGRESS.after_step()


def _stop(point: str, model, optimizer) -> None:
    PROGRESS.armed = False  # the checks below may call modules themselves
    PROGRESS.reach(point)
    if PROGRESS.on_stop is not None:
        PROGRESS.on_stop(point, model, optimizer)
    raise ReachedStop(point, model)
