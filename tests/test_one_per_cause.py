"""One cause is one finding: an undeclared torch version under several calls that need a newer one is one
warning (naming what to declare) with the other calls as related locations; errors stay one per place."""

from __future__ import annotations

import dataclasses
import textwrap

from fsdplint.engine import Settings, lint_file

SRC = """
from torch.distributed.fsdp import fully_shard
from peft import get_peft_model, LoraConfig


def main(model):
    model = get_peft_model(model, LoraConfig(r=8))
    frozen = {p for p in model.parameters() if not p.requires_grad}
    for layer in model.model.layers:
        fully_shard(layer, ignored_params=frozen)
    fully_shard(model.model.embed_tokens, ignored_params=frozen)
    fully_shard(model, ignored_params=frozen)
"""


def _lint(tmp_path, pyproject: str, targets: dict | None = None):
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent(pyproject))
    (tmp_path / "train.py").write_text(SRC)
    s = dataclasses.replace(Settings(), use_installed=False, targets=targets or {})
    return [f for f in lint_file(str(tmp_path / "train.py"), s).findings if f.code == "FSDP001"]


def test_an_undeclared_torch_is_one_warning_with_the_other_calls_related(tmp_path):
    (f,) = _lint(tmp_path, "[project]\nname = 'job'\ndependencies = ['peft']\n")
    assert f.severity.value == "warning" and f.start.row == 10
    assert [r.start.row for r in f.related] == [11, 12]
    assert "torch" in f.message


def test_a_known_old_torch_keeps_an_error_at_each_call(tmp_path):
    found = _lint(tmp_path, "[project]\nname = 'job'\ndependencies = ['torch==2.6.0', 'peft']\n")
    assert [(f.severity.value, f.start.row) for f in found] == [("error", 10), ("error", 11), ("error", 12)]
