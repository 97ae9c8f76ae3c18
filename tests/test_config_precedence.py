"""Rule selection: defaults, then the configuration file, then CLI flags."""

from __future__ import annotations

from fsdplint.config import Config

CODES = ["FSDP001", "FSDP007", "FSDP015", "FSDP101", "FSDP103", "FSDP902"]


def sel(cfg, **cli):
    return cfg.selected_codes(known=CODES, **cli)


def test_default_selects_everything():
    assert sel(Config()) == set(CODES)


def test_config_select_and_ignore():
    assert sel(Config(select=["FSDP1"], ignore=["FSDP103"])) == {"FSDP101"}
    assert sel(Config(ignore=["FSDP0"])) == {"FSDP101", "FSDP103", "FSDP902"}


def test_config_extend_select_adds_to_select():
    assert sel(Config(select=["FSDP1"], extend_select=["FSDP9"])) == {"FSDP101", "FSDP103", "FSDP902"}


def test_cli_select_overrides_config_select_and_ignore():
    cfg = Config(select=["FSDP0"], ignore=["FSDP101"])
    # Naming a rule on the command line wins over the file's ignore.
    assert sel(cfg, select=["FSDP101"]) == {"FSDP101"}


def test_cli_ignore_and_extend_select_apply_on_top_of_config():
    cfg = Config(select=["FSDP0"])
    assert sel(cfg, extend_select=["FSDP101"]) == {"FSDP001", "FSDP007", "FSDP015", "FSDP101"}
    assert sel(cfg, ignore=["FSDP007"]) == {"FSDP001", "FSDP015"}
    assert sel(cfg, ignore=["ALL"]) == set()


def test_selectors_are_case_insensitive():
    assert sel(Config(select=["fsdp10"])) == {"FSDP101", "FSDP103"}
