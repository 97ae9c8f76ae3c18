"""The project view further from the linted file: chains of loaders several modules deep, factories that
pick a class from a table, methods inherited from a base class of another module, imports made inside
functions. What the chain does is followed; where a chain cannot be decided, nothing is reported."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.analysis.index import fact_sheet
from fsdplint.cli import main


def write(root: Path, files: dict) -> None:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))


def run(root: Path, *args: str) -> list[dict]:
    r = CliRunner().invoke(main, ["check", "--isolated", "--output-format", "json", "--exit-zero", "--no-cache", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def rows(found, code: str) -> list[int]:
    return sorted(f["location"]["row"] for f in found if f["code"] == code)


# A loader four modules away from the script: entry -> registry -> builder -> sharding helper.
CHAIN = {
    "pkg/shard.py": """
        from torch.distributed.fsdp import fully_shard


        def shard_blocks(net):
            for block in net.blocks:
                fully_shard(block)
            fully_shard(net)


        def build_sharded(cls, cfg):
            net = cls(cfg)
            shard_blocks(net)
            return net
        """,
    "pkg/builders.py": """
        from pkg.shard import build_sharded


        class NetBuilder:
            def build(self, cfg):
                net = build_sharded(Net, cfg)
                return net


        class TokenizerBuilder:
            def build(self, cfg):
                return Tokenizer(cfg)


        class Components:
            @classmethod
            def builder_for(cls, kind):
                table = {"net": (NetBuilder, "weights"), "tokenizer": (TokenizerBuilder, "vocab")}
                if kind in table:
                    builder_cls, _ = table[kind]
                    return builder_cls()
                return FallbackBuilder()

            @staticmethod
            def load(kind, cfg):
                builder = Components.builder_for(kind)
                return builder.build(cfg)
        """,
    "pkg/entry.py": """
        from pkg.builders import Components


        def load_part(kind, cfg):
            part = Components.load(kind, cfg)
            return part
        """,
}


def test_a_model_sharded_four_modules_away_is_the_model_the_script_gets(project):
    write(project, {**CHAIN, "train.py": """
        from peft import LoraConfig, get_peft_model
        from pkg.entry import load_part

        model = load_part("net", cfg)
        model = get_peft_model(model, LoraConfig(r=8))
        """})
    assert rows(run(project, "train.py"), "FSDP101") == [5]


def test_the_table_entry_the_key_selects_decides_which_builder_runs(project):
    # "tokenizer" selects the builder that shards nothing: LoRA goes into an unwrapped model.
    write(project, {**CHAIN, "train.py": """
        from peft import LoraConfig, get_peft_model
        from pkg.entry import load_part

        model = load_part("tokenizer", cfg)
        model = get_peft_model(model, LoraConfig(r=8))
        """})
    assert rows(run(project, "train.py"), "FSDP101") == []


def test_a_key_that_is_not_known_leaves_the_builder_unknown(project):
    write(project, {**CHAIN, "train.py": """
        import sys
        from peft import LoraConfig, get_peft_model
        from pkg.entry import load_part

        model = load_part(sys.argv[1], cfg)
        model = get_peft_model(model, LoraConfig(r=8))
        """})
    assert rows(run(project, "train.py"), "FSDP101") == []


def test_two_loads_through_one_factory_each_get_their_own_builder(project):
    # The factory is reached twice with different keys: the first answer is not reused for the second.
    write(project, {**CHAIN, "train.py": """
        from peft import LoraConfig, get_peft_model
        from pkg.entry import load_part


        def main(cfg):
            tok = load_part("tokenizer", cfg)
            tok = get_peft_model(tok, LoraConfig(r=8))
            net = load_part("net", cfg)
            net = get_peft_model(net, LoraConfig(r=8))
        """})
    assert rows(run(project, "train.py"), "FSDP101") == []  # two sites: the key is not one constant
    write(project, {"train.py": """
        from peft import LoraConfig, get_peft_model
        from pkg.builders import Components


        def main(cfg):
            tok = Components.builder_for("tokenizer").build(cfg)
            tok = get_peft_model(tok, LoraConfig(r=8))
            builder = Components.builder_for("net")
            net = builder.build(cfg)
            net = get_peft_model(net, LoraConfig(r=8))
        """})
    assert rows(run(project, "train.py"), "FSDP101") == [10]


# A project's own adapter, added by a base class's method through a helper it imports when it runs.
ADAPTER = {
    "pkg/side.py": """
        import torch
        import torch.nn as nn


        def add_side_weights(net, rank):
            net.requires_grad_(False)
            for sub in net.modules():
                if isinstance(sub, nn.Linear):
                    for name in ("side_a", "side_b"):
                        setattr(sub, name, nn.Parameter(torch.zeros(rank, sub.in_features)))
        """,
    "pkg/roles.py": """
        class Role:
            def __init__(self, rank=0):
                self.rank = rank

            def _maybe_side_weights(self, net):
                if not self.rank:
                    return False
                from pkg.side import add_side_weights

                add_side_weights(net, self.rank)
                return True
        """,
}


def test_a_base_class_method_adding_parameters_after_the_shard(project):
    write(project, {**ADAPTER, "pkg/student.py": """
        from torch.distributed.fsdp import fully_shard
        from pkg.roles import Role


        class Student(Role):
            def __init__(self, net, rank):
                super().__init__(rank)
                fully_shard(net)
                self._maybe_side_weights(net)
                self.net = net
        """})
    found = run(project, "pkg/student.py")
    assert rows(found, "FSDP101") == [9]
    assert "side.py" in next(f for f in found if f["code"] == "FSDP101")["message"]


def test_the_same_adapter_before_the_shard_is_fine(project):
    write(project, {**ADAPTER, "pkg/student.py": """
        from torch.distributed.fsdp import fully_shard
        from pkg.roles import Role


        class Student(Role):
            def __init__(self, net, rank):
                super().__init__(rank)
                self._maybe_side_weights(net)
                fully_shard(net)
                self.net = net
        """})
    assert rows(run(project, "pkg/student.py"), "FSDP101") == []


def test_imports_inside_functions_are_on_the_fact_sheet_behind_the_modules_own():
    sheet = fact_sheet(textwrap.dedent("""
        from a import shared


        def f():
            from b import shared, only_here
            import c.d
            return only_here()
        """))
    locals_ = [imp[0] for imp in sheet["imports"]]
    assert set(locals_) == {"shared", "only_here", "c"}
    # The module-level binding comes last, so it is the one a name used elsewhere resolves to.
    assert [imp for imp in sheet["imports"] if imp[0] == "shared"][-1][1] == "a"
