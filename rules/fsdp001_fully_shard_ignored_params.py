import re

import libcst as cst

from fsdplint import behaviour, versions
from fsdplint.audit.examples import spec
from fsdplint.findings import Severity
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid

YAML_FSDP2 = """\
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_version: 2
num_processes: 4
"""
_PREPARED = """
from accelerate import Accelerator
accelerator = Accelerator()
model, optimizer = accelerator.prepare(model, optimizer)
"""

# An `if` test that gates on the torch version (or on the argument being supported).
_GATE = re.compile(r"version|2[._]7|\(\s*2\s*,\s*7|hasattr|signature|ignored_params|_GE_2|GREATER", re.I)


class FullyShardIgnoredParams(Rule):
    code = "FSDP001"
    name = "fully-shard-ignored-params"
    severity = Severity.ERROR
    summary = (
        "`ignored_params` passed to `fully_shard` on torch < 2.7 (TypeError); on >= 2.7 an ignored param "
        "that is trainable is never reduced"
    )
    sides = "SAR"
    versions = {"torch": ">=2.4"}
    doc = """
    ## What it does
    Checks the parameters given to FSDP2's `fully_shard(..., ignored_params=...)`: the argument only
    exists from torch 2.7.0, and an ignored parameter must be frozen. Also finds jobs that accelerate
    prepares with FSDP2 (a launch config, `accelerate launch` flags, `FSDP_VERSION=2` in the environment,
    the Trainer) on accelerate 1.11-1.12, which pass `ignored_params` to `fully_shard` themselves.

    ## Why is this bad?
    On torch <= 2.6 `fully_shard` raises `TypeError: fully_shard() got an unexpected keyword argument
    'ignored_params'`. On >= 2.7, ignored parameters are "not sharded, nor moved to the device during
    init, nor have their gradients reduced": a *trainable* ignored parameter gets a different update on
    every rank and the replicas silently diverge.

    ## Example
    ```python
    fully_shard(model, ignored_params={p for n, p in model.named_parameters() if "lora_" in n})
    ```

    ## Use instead
    ```python
    frozen_4bit = {p for p in model.parameters() if not p.requires_grad and type(p).__name__ == "Params4bit"}
    kwargs = {"ignored_params": frozen_4bit} if torch_version >= (2, 7) else {}
    fully_shard(model, **kwargs)
    ```
    Move ignored parameters to the device yourself.

    ## Fix safety
    No automatic fix: which parameters to ignore is a design decision.

    ## Versions
    `ignored_params` was added to FSDP2 in torch 2.7.0 (pytorch#146631); accelerate and TRL gate it on
    `>= 2.7.0` (accelerate 1.11.0 and 1.12.0 passed it unconditionally, even an empty set; fixed in 1.13.0
    by accelerate#3924). When the project declares no torch and none is installed, the finding is a warning that
    says what the module's own imports already need (the public FSDP2 path: torch >= 2.6) and what to
    declare; a version check, a `try/except TypeError` fallback, or a constructor that refuses older torch
    guards the call.

    ## References
    - pytorch#146631, pytorch#148242, pytorch#149074
    - accelerate#3924, trl#7259
    """
    references = ("https://github.com/pytorch/pytorch/pull/146631",
                  "https://github.com/pytorch/pytorch/issues/149074")

    VALID = [
        # accelerate >= 1.13 passes ignored_params only on torch >= 2.7; 1.10 never did; FSDP1 does not use it.
        Valid(_PREPARED, options={"accelerate_config": YAML_FSDP2}, target={"torch": "2.6", "accelerate": "1.13.0"}),
        Valid(_PREPARED, options={"accelerate_config": YAML_FSDP2}, target={"torch": "2.6", "accelerate": "1.10.1"}),
        Valid(_PREPARED, options={"accelerate_config": YAML_FSDP2.replace("fsdp_version: 2", "fsdp_version: 1")},
              target={"torch": "2.6", "accelerate": "1.12.0"}),
        Valid(_PREPARED, options={"accelerate_config": YAML_FSDP2}, target={"torch": "2.7", "accelerate": "1.12.0"}),
        Valid(_PREPARED, options={"accelerate_config": YAML_FSDP2}, target={"torch": "2.5", "accelerate": "1.12.0"}),
        Valid(
            """
            from torch.distributed.fsdp import fully_shard
            fully_shard(model, ignored_params=frozen_4bit)
            """,
            target={"torch": "2.7"},
        ),
        """
        from torch.distributed._composable.fsdp import fully_shard
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        """,
        # Libraries gate the argument on the torch version (accelerate#3924, trl#7259).
        """
        from accelerate.utils import is_torch_version
        from torch.distributed._composable.fsdp import fully_shard
        kwargs = {"reshard_after_forward": True}
        if is_torch_version(">=", "2.7.0"):
            kwargs["ignored_params"] = frozen_4bit
        fully_shard(model, **kwargs)
        """,
        """
        import torch
        from packaging import version
        import torch.distributed.fsdp as f

        def shard(model, frozen):
            if version.parse(torch.__version__) >= version.parse("2.7"):
                f.fully_shard(model, ignored_params=frozen)
            else:
                f.fully_shard(model)
        """,
        """
        from torch.distributed._composable.fsdp import fully_shard
        TORCH_GE_2_7 = check()
        extra = {"ignored_params": frozen} if TORCH_GE_2_7 else {}
        fully_shard(model, **extra)
        """,
        # A feature check on the signature, and a fallback when the keyword is refused.
        """
        import inspect
        from torch.distributed._composable.fsdp import fully_shard
        if "ignored_params" in inspect.signature(fully_shard).parameters:
            fully_shard(model, ignored_params=frozen)
        else:
            fully_shard(model)
        """,
        """
        from torch.distributed._composable.fsdp import fully_shard
        try:
            fully_shard(model, ignored_params=frozen)
        except (ImportError, TypeError):
            fully_shard(model)
        """,
        # A constructor that refuses old torch guards every method of its class.
        Valid(
            """
            import torch
            from packaging.version import Version
            from torch.distributed._composable.fsdp import fully_shard

            class Engine:
                def __init__(self, frozen):
                    if Version(torch.__version__) < Version("2.7"):
                        raise RuntimeError("this engine needs torch >= 2.7")
                    self.frozen = frozen

                def shard(self, model):
                    fully_shard(model, ignored_params=self.frozen)
            """,
            target={"torch": "2.4"},
        ),
        # The kwargs come from the caller: unknown, so silent.
        """
        from torch.distributed._composable.fsdp import fully_shard
        def shard(model, **fsdp_kwargs):
            fully_shard(model, **fsdp_kwargs)
        """,
    ]
    INVALID = [
        # accelerate 1.11/1.12 add ignored_params to every FSDP2 fully_shard call themselves (accelerate#3924).
        Invalid(_PREPARED, options={"accelerate_config": YAML_FSDP2}, target={"torch": "2.6", "accelerate": "1.12.0"}),
        # ... also when the script itself switches FSDP2 on through the environment accelerate reads.
        Invalid(
            """
            import os
            from accelerate import Accelerator
            os.environ["ACCELERATE_USE_FSDP"] = "true"
            os.environ["FSDP_VERSION"] = "2"
            accelerator = Accelerator()
            model = accelerator.prepare(model)
            """,
            target={"torch": "2.6.0", "accelerate": "1.11.0"},
            line=4,
        ),
        Invalid(
            """
            from torch.distributed._composable.fsdp import fully_shard
            frozen = {p for p in model.parameters() if not p.requires_grad}
            fully_shard(model, ignored_params=frozen)
            """,
            target={"torch": "2.5"},
            line=3,
        ),
        # No version declared or installed: a warning that says what to declare.
        Invalid(
            """
            from torch.distributed._composable.fsdp import fully_shard
            frozen = {p for p in model.parameters() if not p.requires_grad}
            fully_shard(model, ignored_params=frozen)
            """,
            line=3,
            severity="warning",
        ),
        # The module's own imports prove torch >= 2.6, not 2.7.
        Invalid(
            """
            from torch.distributed.fsdp import FSDPModule, fully_shard
            fully_shard(model, ignored_params=frozen)
            assert isinstance(model, FSDPModule)
            """,
            line=2,
            severity="warning",
        ),
        Invalid(
            """
            import torch.distributed.fsdp as f
            fsdp_kwargs = {"mesh": mesh, "ignored_params": frozen}
            for layer in model.layers:
                f.fully_shard(layer, **fsdp_kwargs)
            f.fully_shard(model, **fsdp_kwargs)
            """,
            target={"torch": "2.6"},
            line=2,
        ),
        Invalid(
            """
            from torch.distributed._composable.fsdp import fully_shard as shard
            kwargs = dict(reshard_after_forward=True)
            kwargs["ignored_params"] = frozen

            def main():
                shard(model, **kwargs)
            """,
            target={"torch": "2.4"},
            line=3,
        ),
        Invalid(
            """
            import functools
            from torch.distributed._composable.fsdp import fully_shard
            shard = functools.partial(fully_shard, ignored_params=frozen)
            """,
            target={"torch": "2.5.1"},
            line=3,
        ),
    ]

    AUDIT_VALID = [
        spec(quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"},
             fsdp={"ignored_params": "4bit"}),
        spec(),
    ]
    AUDIT_INVALID = [
        spec(fsdp={"ignored_params": ["*lora_A*"]}),
        spec(quantization={"load_in_4bit": True}, fsdp={"ignored_params": "4bit", "torch": "2.6"}),
    ]

    def check(self, ctx) -> None:
        tv = ctx.version("torch")
        if not tv < "2.7":
            return
        a = ctx.analysis
        severity = ctx.version_severity(tv)
        self._check_accelerate(ctx, a, tv, severity)
        ev = versions.proven("torch", a.c) if tv.known and tv.kind == "declared" else None
        if ev is not None and ev.version > tv.version:
            message = (
                f"`ignored_params` reaches fully_shard, which accepts it only from torch 2.7.0: this module already "
                f"needs torch >= {ev.version} (line {ctx.line(ev.node)}); ignored_params needs >= 2.7, and the "
                f"project admits older releases ({tv.describe()}), where this raises TypeError: fully_shard() got an "
                f"unexpected keyword argument 'ignored_params'. Require torch>=2.7, or pass it only when torch >= 2.7."
            )
        elif tv.known or ctx.strict_versions:
            message = (
                f"`ignored_params` reaches fully_shard, which accepts it only from torch 2.7.0; the target is "
                f"{tv.describe()}, where this raises TypeError: fully_shard() got an unexpected keyword argument "
                f"'ignored_params'. Upgrade to torch >= 2.7, or pass it only when torch >= 2.7."
            )
        else:
            proven = (f"this module already needs torch >= {tv.version} (line {tv.line}); " if tv.kind == "code"
                      else "the torch version is unknown (not declared, not installed); ")
            message = (
                f"`ignored_params` reaches fully_shard, which accepts it only from torch 2.7.0: {proven}"
                f"ignored_params needs >= 2.7, and on an older torch this raises TypeError: fully_shard() got an "
                f"unexpected keyword argument 'ignored_params'. Pass it only when torch >= 2.7, or "
                f"{tv.declare_hint('2.7')}."
            )
        seen = set()
        for call in a.calls("fully_shard"):
            if _gated_call(a, call):
                continue
            for node in _ignored_params_sources(a, call):
                if id(node) not in seen:
                    seen.add(id(node))
                    ctx.report(node, message, severity=severity)
        for call in a.calls("functools_partial"):
            target = call.arg(0)
            q = a.resolver.qualify(target) if target is not None else None
            if q and _is_fully_shard(q) and not _gated_call(a, call):
                arg = call.kwarg("ignored_params")
                if arg is not None:
                    ctx.report(arg, message, severity=severity)

    def _check_accelerate(self, ctx, a, tv, severity) -> None:
        """accelerate 1.11-1.12 pass `ignored_params` to fully_shard themselves for every FSDP2 model they
        prepare (the Trainer's FSDP2 goes through the same code)."""
        launch = getattr(a, "launch", None)
        if launch is None or launch.fsdp_version != 2:
            return
        acc = ctx.version("accelerate")
        if behaviour.holds("accelerate_fsdp2_passes_ignored_params", acc) is not True:
            return
        if tv.known and tv < "2.6":
            return  # accelerate's FSDP2 refuses this torch before it shards anything (ImportError)
        prepares = [e for t in a.timelines for e in t.of("prepare")]
        trainers = a.calls("Trainer")
        if not prepares and not trainers:
            return
        fallback = prepares[0].node if prepares else trainers[0].node
        setting = launch.get("version")
        ctx.report_setting(
            setting,
            f"accelerate prepares this model with FSDP2, and {acc.describe()} always passes `ignored_params` to "
            f"fully_shard (an empty set when no modules are ignored), which torch accepts only from 2.7.0; the "
            f"target is {tv.describe()}, where accelerator.prepare raises TypeError: fully_shard() got an "
            f"unexpected keyword argument 'ignored_params'. Use accelerate >= 1.13 (it passes the argument only "
            f"on torch >= 2.7) or torch >= 2.7."
            + (f" ({tv.declare_hint('2.7')}.)" if severity is not None else ""),
            fallback=fallback,
            severity=severity,
            rests_on=("accelerate_fsdp2_passes_ignored_params",),
        )

    def audit(self, ctx):
        ctx.report_problems(self)
        plan = ctx.plan
        if not plan.ignored:
            return
        if plan.version == 2 and not ctx.torch_at_least("2.7"):
            ctx.report(self, f"fully_shard(ignored_params=...) needs torch >= 2.7; torch {ctx.torch_version} "
                             f"({ctx.torch_version_source}) raises TypeError: fully_shard() got an unexpected "
                             f"keyword argument 'ignored_params'. Upgrade torch, or pass it only when "
                             f"torch >= 2.7.", field="fsdp.ignored_params")
        trainable = [p for p in plan.ignored if p.requires_grad]
        if trainable:
            names = ", ".join(p.fqn for p in trainable[:3]) + (", ..." if len(trainable) > 3 else "")
            ctx.report(self, f"{len(trainable)} trainable parameter(s) are in ignored_params ({names}): FSDP "
                             f"neither shards them nor reduces their gradients, so every rank trains its own "
                             f"copy and the replicas diverge. Ignore only frozen parameters (e.g. the 4-bit "
                             f"base weights).", field="fsdp.ignored_params", param=trainable[0].fqn)


def _is_fully_shard(qualname):
    from fsdplint.apis import api_of

    return api_of(qualname) == "fully_shard"


def _gate_in(a, guards) -> bool:
    for g in guards:
        if g.kind == "version" or g.caught & {"TypeError", "Exception", "BaseException"}:
            return True  # a version/feature check, or `try: ... except TypeError:` with a fallback
        test = getattr(g.node, "test", None)
        if test is not None and _GATE.search(a.code(test)):
            return True
    return False


def _gated_call(a, call) -> bool:
    """True when every way the call runs is behind a version check (its own `if`, or its helper's call site)."""
    if _gate_in(a, call.guards):
        return True
    steps = [s for t in a.timelines for s in t.steps if s.item is call]
    return bool(steps) and all(any(_gate_in(a, c.guards) for c in a.site_calls(s)) for s in steps)


def _ignored_params_sources(a, call):
    """Nodes that put `ignored_params` into this call: the keyword, a `**dict` entry, `d["ignored_params"] = ...`."""
    arg = call.kwarg("ignored_params")
    if arg is not None:
        yield arg
    for star in call.star_kwargs():
        name = dotted(star)
        if name is None:
            continue
        bound = a.binding(name, call.scope)
        if isinstance(bound, cst.Dict):
            for el in bound.elements:
                if isinstance(el, cst.DictElement) and a.value(el.key, call.scope) == "ignored_params":
                    yield el
        elif isinstance(bound, cst.Call) and dotted(bound.func) == "dict":
            for x in bound.args:
                if x.keyword is not None and x.keyword.value == "ignored_params":
                    yield x
        scopes = {id(call.scope): call.scope, id(a.c.module_scope): a.c.module_scope}
        for scope in scopes.values():
            if scope is not call.scope and name in call.scope.assigns:
                continue  # a local binding shadows the module-level dict
            for ds in scope.dict_sets:
                if ds.target == name and ds.key == "ignored_params" and not _gate_in(a, ds.guards):
                    yield ds.stmt.node if ds.stmt is not None else ds.value
            for c in scope.calls:
                if c.method == "update" and dotted(c.receiver) == name and not _gate_in(a, c.guards):
                    if c.kwarg("ignored_params") is not None:
                        yield c.kwarg("ignored_params")
                    for x in c.node.args:
                        if isinstance(x.value, cst.Dict) and any(
                            isinstance(el, cst.DictElement) and a.value(el.key, c.scope) == "ignored_params"
                            for el in x.value.elements
                        ):
                            yield x
