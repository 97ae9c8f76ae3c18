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
