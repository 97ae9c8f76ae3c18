from typing import Optional

import libcst as cst

from fsdplint.analysis import UNKNOWN, QName
from fsdplint.findings import Severity
from fsdplint.rule import IN_FSDP_JOB, Invalid, Rule

# peft adds these heads to `modules_to_save` itself for classification / QA task types.
_TASKS_WITH_HEADS = {"SEQ_CLS": "classifier/score", "TOKEN_CLS": "classifier/score", "QUESTION_ANS": "qa_outputs"}


class FreezeByNameDropsModulesToSave(Rule):
    code = "FSDP112"
    name = "freeze-by-name-drops-modules-to-save"
    severity = Severity.ERROR
    summary = "Freezing by `\"lora\" in name` also freezes `modules_to_save` copies."
    sides = "S"
    doc = """
    ## What it does
    Finds loops over `model.named_parameters()` after LoRA is injected that set `requires_grad = False`
    for every parameter whose name does not contain `"lora"` (or set `requires_grad = "lora" in name`),
    when the LoRA config trains extra modules: a non-empty `modules_to_save`, or a classification / QA
    `task_type` (peft then adds the `classifier`/`score`/`qa_outputs` head to `modules_to_save` itself).

    ## Why is this bad?
    peft trains `modules_to_save` as full copies named `...modules_to_save.default.weight` — no `"lora"`
    in the name. The loop freezes them, so the new head (or the embeddings you meant to train) never
    learns, silently. Under FSDP1 it can also leave units with mixed `requires_grad`.

    ## Example
    ```python
    model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", target_modules=["q_proj", "v_proj"]))
    for name, p in model.named_parameters():
        if "lora" not in name:
            p.requires_grad = False
    ```

    ## Use instead
    ```python
    for name, p in model.named_parameters():
        if "lora" not in name and "modules_to_save" not in name:
            p.requires_grad = False
    ```
    or drop the loop: `get_peft_model` already freezes the base model.

    ## Fix safety
    No automatic fix: the loop may be meant to freeze other things too.

    ## Versions
    All peft versions.

    ## References
    - peft src peft_model.py (task heads added to `modules_to_save`); peft docs (modules_to_save)
    """

    VALID = [
        """
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(modules_to_save=["lm_head"], target_modules=["q_proj"]))
        for name, p in model.named_parameters():
            if "lora" not in name and "modules_to_save" not in name:
                p.requires_grad = False
        """,
        # No modules_to_save: freezing by name is harmless.
        """
        from peft import LoraConfig, get_peft_model as add_lora
        model = add_lora(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
        for name, p in model.named_parameters():
            if "lora" not in name:
                p.requires_grad = False
        """,
        # Freezing before LoRA is injected: peft creates the trainable copies afterwards.
        """
        from peft import LoraConfig, get_peft_model
        for name, p in model.named_parameters():
            if "lora" not in name:
                p.requires_grad = False
        model = get_peft_model(model, LoraConfig(task_type="SEQ_CLS", target_modules=["q_proj"]))
        """,
        # Only turning LoRA on; nothing is frozen.
        """
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(modules_to_save=["score"], target_modules=["q_proj"]))
        for name, p in model.named_parameters():
            if "lora" in name:
                p.requires_grad = True
        """,
    ]
    INVALID = [
        Invalid(
            """
            from peft import LoraConfig, get_peft_model
            cfg = LoraConfig(task_type="SEQ_CLS", target_modules=["q_proj", "v_proj"])
            model = get_peft_model(model, cfg)
            for name, p in model.named_parameters():
                if "lora" not in name:
                    p.requires_grad = False
            """,
            options=IN_FSDP_JOB,
            line=6,
        ),
        Invalid(
            """
            import peft
            cfg = peft.LoraConfig(r=16, modules_to_save=["embed_tokens", "lm_head"], target_modules="all-linear")
            model = peft.get_peft_model(model, cfg)
            for n, param in model.named_parameters():
                param.requires_grad = "lora_" in n
            """,
            options=IN_FSDP_JOB,
            line=5,
        ),
        Invalid(
            """
            from peft import LoraConfig, TaskType, get_peft_model as add_lora

            def freeze(model):
                for name, p in model.named_parameters():
                    if "lora" in name:
                        p.requires_grad = True
                    else:
                        p.requires_grad = False

            model = add_lora(model, LoraConfig(task_type=TaskType.TOKEN_CLS, target_modules=["query", "value"]))
            freeze(model)
            """,
            options=IN_FSDP_JOB,
            line=8,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        extra = _extra_trainables(a)
        if not extra:
            return
        for t in a.timelines:
            loras = t.of("lora")
            if not loras:
                continue
            for step in t.steps:
                item = step.item
                if not hasattr(item, "target") or getattr(item, "key", None) is not None:
                    continue
                if not item.target.endswith(".requires_grad") or not item.loops:
                    continue
                loop = item.loops[-1]
                ref = a._loop_model(step, loop.iter)
                if ref is None or not _named_params_loop(loop):
                    continue
                name_var = loop.target.split(",")[0]
                if not _freezes_by_lora_name(a, item, name_var):
                    continue
                entity = t.find(ref.key)
                if not any(l.entity == entity and l.seq < step.order for l in loras):
                    continue
                ctx.report(
                    item.value if isinstance(item.value, cst.Comparison) else item.stmt.node if item.stmt else item.value,
                    f"This loop freezes every parameter without 'lora' in its name, including peft's modules_to_save "
                    f"copies ({extra}), which are named '...modules_to_save.default...': they silently stop training. "
                    "Also keep names containing 'modules_to_save' trainable, or drop the loop (get_peft_model "
                    "already freezes the base).",
                )


def _named_params_loop(loop) -> bool:
    it = loop.iter
    while isinstance(it, cst.Call) and not isinstance(it.func, cst.Attribute) and it.args:
        it = it.args[0].value  # enumerate(...), list(...)
    return isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute) and it.func.attr.value == "named_parameters"


def _has_lora_literal(node) -> bool:
    return any(isinstance(n, cst.SimpleString) and "lora" in str(n.evaluated_value).lower() for n in _walk(node))


def _walk(node):
    yield node
    for c in node.children:
        yield from _walk(c)


def _mentions_modules_to_save(a, node) -> bool:
    return "modules_to_save" in a.code(node) or "original_module" in a.code(node)


def _freezes_by_lora_name(a, item, name_var: str) -> bool:
    """`requires_grad = False` on the branch where the name has no "lora", or `requires_grad = "lora" in name`."""
    value = item.value
    if isinstance(value, cst.Comparison) and _has_lora_literal(value) and not _mentions_modules_to_save(a, value):
        ops = value.comparisons
        return len(ops) == 1 and isinstance(ops[0].operator, cst.In) and name_var in a.code(value)
    if a.value(value, item.scope) is not False:
        return False
    for g in reversed(item.guards):
        node = g.node
        test = getattr(node, "test", None)
        if test is None or not _has_lora_literal(test) or name_var not in a.code(test):
            continue
        if _mentions_modules_to_save(a, test) or isinstance(test, cst.BooleanOperation):
            return False
        negated = _negated(test)
        if negated is None:
            return False
        in_body = _inside(node.body, item.stmt.node if item.stmt else None)
        # False in the body of `if "lora" not in n`, or in the else of `if "lora" in n`.
        return negated == in_body
    return False


def _negated(test) -> Optional[bool]:
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        op = test.comparisons[0].operator
        if isinstance(op, cst.NotIn):
            return True
        if isinstance(op, cst.In):
            return False
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = _negated(test.expression)
        return None if inner is None else not inner
    return None


def _inside(block, stmt) -> bool:
    return stmt is not None and any(n is stmt for n in _walk(block))


def _extra_trainables(a) -> Optional[str]:
    """What peft will train besides LoRA: modules_to_save names, or the task head; None if nothing known."""
    for call in a.calls("LoraConfig"):
        mts = a.keyword(call, "modules_to_save")
        if mts is not None and mts is not UNKNOWN:
            v = a.value(mts, call.scope)
            if isinstance(v, (list, tuple)) and v:
                return ", ".join(map(str, v))
        task = a.keyword(call, "task_type")
        if task is not None and task is not UNKNOWN:
            v = a.value(task, call.scope)
            name = str(v).rsplit(".", 1)[-1] if isinstance(v, (str, QName)) else None
            if name in _TASKS_WITH_HEADS:
                return f"the {_TASKS_WITH_HEADS[name]} head of a {name} model"
    return None
