"""A tree copied inside another, unrelated git repository still resolves its own top-level packages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

LOADING = """\
from transformers import AutoModelForCausalLM, BitsAndBytesConfig


def load(name):
    return AutoModelForCausalLM.from_pretrained(name, quantization_config=BitsAndBytesConfig(load_in_4bit=True))
"""
HEAD = """\
import functools

from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
"""
IMPORTS = {
    "from": "from mypkg.loading import load\nmodel = FSDP(load('m'), auto_wrap_policy=policy)\n",
    "module": "import mypkg.loading as L\nmodel = FSDP(L.load('m'), auto_wrap_policy=policy)\n",
}


@pytest.mark.parametrize("where", ["train.py", "scripts/train.py", "jobs/sft/train.py"])
@pytest.mark.parametrize("style", sorted(IMPORTS))
def test_own_package_imports_resolve_below_an_outer_repository(tmp_path, monkeypatch, where, style):
    outer = tmp_path / "outer"
    proj = outer / "third_party" / "proj"
    for rel, text in {"mypkg/__init__.py": "", "mypkg/loading.py": LOADING, where: HEAD + IMPORTS[style]}.items():
        (proj / rel).parent.mkdir(parents=True, exist_ok=True)
        (proj / rel).write_text(text)
    (outer / ".git").mkdir()
    monkeypatch.chdir(outer)
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--output-format", "json",
                                  "--target-version", "torch=2.6", f"third_party/proj/{where}"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    (f,) = json.loads(r.stdout)
    assert f["code"] == "FSDP202" and f["severity"] == "error"
    assert any(x["filename"].endswith("mypkg/loading.py") for x in f["related"])
