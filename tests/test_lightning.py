"""Lightning as the FSDP wrap: the strategy a Trainer / Fabric runs, its use_orig_params by Lightning version,
and the LightningModule hooks around the wrap, seen through the command line as a user runs it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint import behaviour, versions
from fsdplint.cli import main

MODULE = """
    import torch
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import FSDPStrategy
    from net import Net


    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = Net()

        def configure_optimizers(self):
            return {optimizer}


    if __name__ == "__main__":
        pl.Trainer(devices=4, strategy=FSDPStrategy(auto_wrap_policy={{torch.nn.TransformerEncoderLayer}})).fit(Module())
"""
NET = """
    import torch


    class Net(torch.nn.Module):
        def build_optimizer(self, lr):
            decay = [p for n, p in self.named_parameters() if p.dim() >= 2]
            return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}], lr=lr)
"""


def write(root: Path, files: dict) -> None:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))


def run(*args: str) -> list[dict]:
    r = CliRunner().invoke(main, ["check", "--isolated", "--no-cache", "--output-format", "json", "--exit-zero", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def found(results, code):
    return [(f["filename"], f["location"]["row"], f["severity"]) for f in results if f["code"] == code]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A folder of scripts with no project marker, linted as `fsdplint check .`."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("pin, expected", [
    ("pytorch-lightning==2.0.0", "error"),  # 2.0 leaves use_orig_params False: the LightningModule's own params are stale
    ("lightning==2.2.1", None),  # 2.1+ passes use_orig_params=True: the module keeps its parameters
    (None, None),  # unknown: Lightning's own pattern from 2.1 on (and 2.0 refuses it at once): not reported
])
def test_configure_optimizers_over_a_submodule_of_another_file(folder, pin, expected):
    files = {"train.py": MODULE.format(optimizer="self.net.build_optimizer(1e-4)"), "net.py": NET}
    if pin:
        files["requirements.txt"] = pin + "\n"
    write(folder, files)
    hits = found(run("."), "FSDP102")
    if expected is None:
        assert hits == []
    else:
        # reported at the delegation in train.py; the optimizer itself is built in net.py
        assert hits == [("train.py", 13, expected)], hits


def test_configure_optimizers_over_the_wrapped_model_is_silent(folder):
    write(folder, {"train.py": MODULE.format(optimizer="torch.optim.AdamW(self.trainer.model.parameters(), lr=1e-4)"),
                   "net.py": NET, "requirements.txt": "pytorch-lightning==2.0.0\n"})
    assert found(run("."), "FSDP102") == []


def test_a_module_that_wraps_its_own_layers_is_silent(folder):
    # configure_sharded_model: Lightning leaves the root unwrapped, the module's parameters are FSDP's.
    sharded = MODULE.format(optimizer="torch.optim.AdamW(self.parameters(), lr=1e-4)").replace(
        "    def configure_optimizers", "    def configure_sharded_model(self):\n        pass\n\n    def configure_optimizers")
    write(folder, {"train.py": sharded, "net.py": NET, "requirements.txt": "pytorch-lightning==2.0.0\n"})
    assert found(run("."), "FSDP102") == []


def test_requirements_of_the_linted_folder_count_for_scripts_below_it(folder):
    # No project marker: the requirements file at the linted folder's top pins the script in finetune/.
    write(folder, {
        "requirements.txt": "torch==2.0.1\nlightning==2.0.9\n",
        "finetune/run.py": """
            import torch
            import lightning as L

            fabric = L.Fabric(devices=2, strategy="fsdp")
            optimizer = torch.optim.Adam(model.parameters())
            model = fabric.setup_module(model)
        """,
    })
    assert found(run("."), "FSDP102") == [("finetune/run.py", 5, "error")]


def test_fabric_setup_first_then_optimizer_is_silent(folder):
    write(folder, {"requirements.txt": "lightning-fabric==2.0.0\n", "run.py": """
        import torch
        from lightning_fabric import Fabric

        fabric = Fabric(strategy="fsdp")
        model = fabric.setup_module(model)
        optimizer = fabric.setup_optimizers(torch.optim.Adam(model.parameters()))
    """})
    assert found(run("."), "FSDP102") == []


def test_lightning_version_reads_every_distribution_name(tmp_path):
    for pin in ("lightning==2.0.3", "pytorch-lightning==2.0.3", "lightning_fabric==2.0.3"):
        (tmp_path / "requirements.txt").write_text(pin + "\n")
        versions._declared.cache_clear()
        versions.project_dirs.cache_clear()
        tv = versions.resolve("lightning", tmp_path / "train.py", use_installed=False)
        assert (str(tv.version), tv.known) == ("2.0.3", True), pin


def test_a_development_build_of_the_release_that_changed_it_is_undecided():
    dev = versions.TargetVersion("lightning", versions.Version("2.1.0.dev0"), "requirements.txt", "declared")
    old = versions.TargetVersion("lightning", versions.Version("2.0.9"), "requirements.txt", "declared")
    assert behaviour.holds("lightning_fsdp_use_orig_params", dev) is None
    assert behaviour.holds("lightning_fsdp_use_orig_params", old) is False


def test_trainer_checkpoint_before_2_1_and_the_gathering_subclass(folder):
    script = """
        import pytorch_lightning as pl
        from pytorch_lightning.callbacks import ModelCheckpoint
        from pytorch_lightning.strategies import FSDPStrategy
        {subclass}
        trainer = pl.Trainer(strategy={cls}(auto_wrap_policy={{Block}}), callbacks=[ModelCheckpoint(dirpath="out")])
        trainer.fit(module)
    """
    write(folder, {"requirements.txt": "pytorch-lightning==2.0.0\n",
                   "plain.py": script.format(subclass="", cls="FSDPStrategy"),
                   "custom.py": script.format(cls="Gathering", subclass="""
        class Gathering(FSDPStrategy):
            def lightning_module_state_dict(self):
                return gather_full_state_dict(self.model)
        """)})
    results = run(".")
    assert found(results, "FSDP402") == [("plain.py", 5, "error")]


def test_a_lightning_module_of_another_file_built_where_the_trainer_runs(folder):
    write(folder, {
        "requirements.txt": "pytorch-lightning==2.0.2\n",
        "model.py": """
            import torch
            import pytorch_lightning as pl


            class Module(pl.LightningModule):
                def configure_optimizers(self):
                    return torch.optim.AdamW(self.parameters(), lr=1e-4)
        """,
        "train.py": """
            import pytorch_lightning as pl
            from model import Module

            module = Module()
            pl.Trainer(strategy="fsdp").fit(module)
        """,
    })
    # reported where the module is built for the FSDP Trainer; model.py alone runs no Trainer
    assert found(run("."), "FSDP102") == [("train.py", 4, "error")]
