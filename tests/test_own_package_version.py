"""Linting a library's own repository: that library's version is the checkout's own."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

SHAPES = {
    "static": {"pyproject.toml": '[project]\nname = "trl"\nversion = "0.9.2"\n'},
    "version-file": {"pyproject.toml": '[project]\nname = "trl"\ndynamic = ["version"]\n'
                                       '[tool.setuptools.dynamic]\nversion = { file = "VERSION" }\n',
                     "VERSION": "0.9.2.dev0\n"},
    "setup-and-init": {"setup.py": 'from setuptools import setup\nsetup(name="trl", version=VERSION)\n',
                       "src/trl/__init__.py": '__version__ = "0.9.2.dev0"\n'},
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_repositorys_own_package_version_is_that_librarys_version(tmp_path, monkeypatch, shape):
    root = tmp_path / "trl"
    for rel, text in {**SHAPES[shape], "examples/scripts/sft.py": "import trl\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    monkeypatch.chdir(root)
    r = CliRunner().invoke(main, ["check", "--isolated", "--show-settings", "examples/scripts/sft.py"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    (line,) = [l.strip() for l in r.stdout.splitlines() if l.strip().startswith("trl ")]
    assert line.startswith("trl 0.9.2 (") and "this project is trl 0.9.2" in line
    # Another library of the same checkout is not its version.
    assert "peft 0.9.2" not in r.stdout


# axolotl builds BitsAndBytesConfig(bnb_4bit_quant_storage=torch.bfloat16) for `adapter: qlora` from release
# 0.5.0; 0.4.0 did not (behaviour axolotl_qlora_fsdp_storage, read at both tags). Commits between the two tags
# still say 0.4.0 in setup.py.
QLORA_FSDP_YAML = """\
base_model: meta-llama/Llama-2-7b-hf
load_in_4bit: true
adapter: qlora
bf16: auto
fsdp:
  - full_shard
  - auto_wrap
fsdp_config:
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
"""


def _axolotl_checkout(tmp_path: Path, version: str, layout: str) -> Path:
    root = tmp_path / f"axolotl-{version}-{layout}"
    files = {"examples/llama-2/qlora-fsdp.yml": QLORA_FSDP_YAML, "src/axolotl/__init__.py": ""}
    if layout == "setup":
        files["setup.py"] = f'from setuptools import setup\n\nsetup(\n    name="axolotl",\n    version="{version}",\n)\n'
    else:
        files["pyproject.toml"] = f'[project]\nname = "axolotl"\nversion = "{version}"\n'
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.mark.parametrize("layout", ["setup", "pyproject"])
def test_a_checkout_that_says_the_release_before_a_change_may_hold_it(tmp_path, monkeypatch, layout):
    # A tree that says 0.4.0 is 0.4.0 or any commit after it: the storage may be set, so no error.
    root = _axolotl_checkout(tmp_path, "0.4.0", layout)
    monkeypatch.chdir(root)
    r = CliRunner().invoke(main, ["check", "--isolated", "examples/llama-2/qlora-fsdp.yml"], catch_exceptions=False)
    assert "FSDP202 [error]" not in r.output, r.output
    # A tree that says an older release is before 0.4.0, which still lacked it: the error stands.
    root = _axolotl_checkout(tmp_path, "0.3.0", layout)
    monkeypatch.chdir(root)
    r = CliRunner().invoke(main, ["check", "--isolated", "examples/llama-2/qlora-fsdp.yml"], catch_exceptions=False)
    assert r.exit_code == 1 and "FSDP202" in r.output, r.output


def test_a_declared_pin_of_the_release_before_a_change_is_that_release(tmp_path, monkeypatch):
    # A user's project pinning axolotl==0.4.0 runs that release, not a later commit: the error stands.
    root = tmp_path / "job"
    (root / "cfg").mkdir(parents=True)
    (root / "cfg/qlora-fsdp.yml").write_text(QLORA_FSDP_YAML)
    (root / "requirements.txt").write_text("axolotl==0.4.0\n")
    monkeypatch.chdir(root)
    r = CliRunner().invoke(main, ["check", "--isolated", "cfg/qlora-fsdp.yml"], catch_exceptions=False)
    assert r.exit_code == 1 and "FSDP202" in r.output, r.output
