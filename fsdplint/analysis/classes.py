"""Classes as programs: the methods of a class share `self`, a Trainer subclass's hooks get its model,
and parameters annotated with an FSDP type arrive wrapped."""

from __future__ import annotations

import libcst as cst

from fsdplint.analysis.timeline import Timeline
from fsdplint.apis import api_of
from fsdplint.behaviour import TRAINER_CALLBACK_EVENTS
from fsdplint.collect import Scope

# Trainer methods a subclass overrides that receive the trainer's model as `model`.
_TRAINER_HOOKS = {"compute_loss", "training_step", "prediction_step", "evaluation_loop", "_save", "save_model"}


def _is_test_class(klass: str, methods: list[Scope], c) -> bool:
    bases = getattr(c, "class_bases", {}).get(klass, ())
    return (klass.startswith("Test") or any(b.endswith("TestCase") for b in bases)
            or any(m.name.startswith("test") for m in methods))


class Classes:
    """Mixin of `Builder`: how entry scopes group into programs."""

    def _programs(self, entries: list[Scope]) -> list[list[Scope]]:
        """Entry scopes grouped into programs: each function alone; the entry methods of a class
        (not a test case) together, `__init__` first, as `obj = C(...); obj.a(); obj.b()` runs them,
        so `self.model` set in one method is the model the others use."""
        out: list[list[Scope]] = []
        by_class: dict[str, list[Scope]] = {}
        for scope in entries:
            if scope.klass is not None and self.c.methods.get((scope.klass, scope.name)) is scope:
                if scope.klass not in by_class:
                    by_class[scope.klass] = []
                    out.append(by_class[scope.klass])
                by_class[scope.klass].append(scope)
            else:
                out.append([scope])
        result = []
        for group in out:
            klass = group[0].klass if len(group) > 1 else None
            if klass is not None and not _is_test_class(klass, group, self.c):
                group.sort(key=lambda s: (s.name != "__init__", 0))
                result.append(group)
            else:
                result.extend([s] for s in group)
        return result

    def _hook_params(self, scope: Scope) -> dict[str, str]:
        """A Trainer subclass's hooks (`compute_loss(self, model, inputs)`, `training_step(self, model, ...)`)
        receive the trainer's own model: `model` there is `self.model`. A TrainerCallback's events
        (`on_save(self, args, state, control, **kwargs)`) get it as `model=` (a `model` parameter, or
        `kwargs["model"]`): the Trainer's model, `trainer.model` (behaviour `trainer_callback_gets_model`)."""
        if scope.klass is None:
            return {}
        if scope.name in TRAINER_CALLBACK_EVENTS and self._is_trainer_callback(scope.klass):
            out = {"model": "trainer.model"} if "model" in scope.params else {}
            star = scope.node.params.star_kwarg if isinstance(scope.node, cst.FunctionDef) else None
            if isinstance(star, cst.Param):
                out[f"**{star.name.value}"] = "trainer.model"  # read by `Builder.ref` for kwargs["model"]
            return out
        if "model" not in scope.params or scope.name not in _TRAINER_HOOKS:
            return {}
        bases = self.c.class_bases.get(scope.klass, ()) if hasattr(self.c, "class_bases") else ()
        if any(b.endswith("Trainer") for b in bases):
            return {"model": "self.model"}
        return {}

    def _is_trainer_callback(self, klass: str, depth: int = 0) -> bool:
        """`class C(TrainerCallback)` (transformers'), also through a callback class of the same file."""
        for base in getattr(self.c, "class_bases", {}).get(klass, ()):
            head, _, rest = base.partition(".")
            q = self.resolver.names.get(head)
            q = f"{q}.{rest}" if q and rest else q
            if base.rsplit(".", 1)[-1] == "TrainerCallback" and (q is None or q.startswith("transformers")):
                return True
            if depth < 3 and base in self.c.class_bases and self._is_trainer_callback(base, depth + 1):
                return True
        return False

    def _assumed_wraps(self, scopes: list[Scope], t: Timeline) -> dict[str, str]:
        """Parameters annotated with an FSDP type (`def train(model: FSDP)`): wrapped on entry."""
        out = {}
        for scope in scopes:
            for name, ann in getattr(scope, "annotations", {}).items():
                api = api_of(self.resolver.qualify(ann))
                state = {"FSDP1": "fsdp1", "FSDPModule": "fsdp2"}.get(api)
                if state is not None:
                    key = (f"{scope.name}:" if len(scopes) > 1 else "") + name
                    out[key] = state
                    t.model_keys.add(key)
        return out
