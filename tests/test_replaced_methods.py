"""A library method the project replaces on the object (`model.gradient_checkpointing_enable = MethodType(fn,
model)`) runs the project's function: what that function does decides, not the library's defaults. The
function may sit in the linted file or in another module, and the answer must not depend on which files one
process lints first (a partial parse of the other module keeps the functions it names without calling)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

# The project's replacement makes the checkpointed inputs require grad itself, in three ways users write it.
ENABLES = {
    "enable_input_require_grads": """
        def _enable(self, gradient_checkpointing_kwargs=None):
            self._set_gradient_checkpointing(enable=True)
            self.enable_input_require_grads()
    """,
    "requires_grad_ in a nested checkpoint function": """
        def _enable(self, gradient_checkpointing_kwargs=None):
            def run(func, *args, **kwargs):
                for arg in args:
                    if torch.is_tensor(arg):
                        arg.requires_grad_(True)
                return checkpoint(func, *args, **kwargs)
            self._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=run)
    """,
    "requires_grad_ in a helper the replacement calls": """
        def _wrap(checkpoint_func):
            def run(func, *args, **kwargs):
                for arg in args:
                    arg.requires_grad_(True)
                return checkpoint_func(func, *args, **kwargs)
            return run

        def _enable(self, gradient_checkpointing_kwargs=None):
            self._set_gradient_checkpointing(enable=True, gradient_checkpointing_func=_wrap(checkpoint))
    """,
    "requires_grad = True on the embedding output": """
        def _enable(self, gradient_checkpointing_kwargs=None):
            def hook(module, inputs, output):
                output.requires_grad = True
            self.get_input_embeddings().register_forward_hook(hook)
            self._set_gradient_checkpointing(enable=True)
    """,
}
DOES_NOT = """
    def _enable(self, gradient_checkpointing_kwargs=None):
        self._set_gradient_checkpointing(enable=True)
"""
HEAD = """
    import torch
    from functools import partial
    from types import MethodType
    from torch.utils.checkpoint import checkpoint
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
"""
# How the replacement is bound to the model.
BINDINGS = {
    "MethodType": "model.gradient_checkpointing_enable = MethodType(_enable, model)",
    "partial": "model.gradient_checkpointing_enable = partial(_enable, model)",
    "a partial bound to a name first": ("enable = partial(_enable, gradient_checkpointing_kwargs=None)\n"
                                        "        model.gradient_checkpointing_enable = MethodType(enable, model)"),
}
USE = """
    def prepare(model):
        {bind}
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={{"use_reentrant": True}})
        return model
"""
MAIN = """
    def main():
        model = AutoModelForCausalLM.from_pretrained("m")
        # LoRA first: get_peft_model on a checkpointing model would enable input grads itself.
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
        model = prepare(model)
"""


def _lint(root: Path, *args: str) -> list[tuple]:
    # transformers 4.x: reentrant checkpointing is what the library method would do (v5 changed the default).
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--no-cache", "--select", "FSDP105,FSDP900",
                                  "--target-version", "transformers=4.46",
                                  "--output-format", "json", *args, str(root)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return sorted((Path(f["filename"]).name, f["code"], f["severity"]) for f in json.loads(r.stdout))


def _src(*parts: str) -> str:
    return "".join(textwrap.dedent(p) for p in parts)


def _write(root: Path, files: dict) -> Path:
    (root / ".git").mkdir(parents=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize("how", sorted(ENABLES))
@pytest.mark.parametrize("bind", sorted(BINDINGS))
def test_replacement_that_enables_input_grads_is_not_reported(tmp_path, how, bind):
    src = _src(HEAD, ENABLES[how], USE.format(bind=BINDINGS[bind]), MAIN)
    assert _lint(_write(tmp_path / "one", {"train.py": src})) == []


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_replacement_in_another_module_is_read_whatever_the_lint_order(tmp_path, jobs):
    # The function and its binding live in ckpt.py; train.py (linted first, or in another process) calls it.
    files = {
        "ckpt.py": _src(HEAD, ENABLES["requires_grad_ in a nested checkpoint function"],
                        USE.format(bind=BINDINGS["MethodType"])),
        "train.py": _src(HEAD, "from ckpt import prepare\n", MAIN, "\nmain()\n"),
    }
    assert _lint(_write(tmp_path / "two", files), "-j", jobs) == []


def test_replacement_that_leaves_inputs_alone_is_still_an_error(tmp_path):
    src = _src(HEAD, DOES_NOT, USE.format(bind=BINDINGS["MethodType"]), MAIN)
    assert _lint(_write(tmp_path / "one", {"train.py": src})) == [("train.py", "FSDP105", "error")]


def test_replacement_whose_code_is_not_read_is_a_warning(tmp_path):
    # The replacement comes from a library: what it does is not known here.
    src = _src(HEAD.replace("from functools import partial", "from somelib import enable_gc as _enable"),
               USE.format(bind=BINDINGS["MethodType"]), MAIN)
    assert _lint(_write(tmp_path / "one", {"train.py": src})) == [("train.py", "FSDP105", "warning")]


def test_no_replacement_keeps_the_explicit_reentrant_error(tmp_path):
    src = _src(HEAD, USE.format(bind="pass"), MAIN)
    assert _lint(_write(tmp_path / "one", {"train.py": src})) == [("train.py", "FSDP105", "error")]
