"""Configuration files: discovery, keys, warnings, errors and precedence."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fsdplint import config as cfgmod
from fsdplint.config import load_config
from fsdplint.errors import UsageError


@pytest.fixture(autouse=True)
def fresh_cache():
    cfgmod.clear_cache()
    yield
    cfgmod.clear_cache()


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


def test_no_config_gives_defaults(tmp_path):
    cfg = load_config(write(tmp_path / "train.py", "x = 1\n"))
    assert cfg.source is None
    assert cfg.select is None and cfg.ignore == [] and cfg.target_version == {}
    assert ".venv" in cfg.exclude


def test_pyproject_table_found_by_walking_up(tmp_path):
    write(tmp_path / "pyproject.toml", """
        [project]
        name = "demo"

        [tool.fsdplint]
        select = ["FSDP1"]
        ignore = ["FSDP103"]
        extend-select = ["FSDP9"]
        per-file-ignores = { "tests/*" = ["FSDP101"] }
        extend-exclude = ["legacy"]
        fixable = ["ALL"]
        unfixable = ["FSDP007"]
        target-version = { torch = "2.6", peft = "0.13" }

        [tool.fsdplint.rules.FSDP003]
        max-unit-params = 1_000_000
    """)
    script = write(tmp_path / "src" / "deep" / "train.py", "x = 1\n")
    cfg = load_config(script)
    assert cfg.source == (tmp_path / "pyproject.toml").absolute()
    assert cfg.select == ["FSDP1"]
    assert cfg.ignore == ["FSDP103"]
    assert cfg.extend_select == ["FSDP9"]
    assert cfg.per_file_ignores == {"tests/*": ["FSDP101"]}
    assert cfg.extend_exclude == ["legacy"]
    assert cfg.fixable == ["ALL"] and cfg.unfixable == ["FSDP007"]
    assert cfg.target_version == {"torch": "2.6", "peft": "0.13"}
    assert cfg.rules["FSDP003"] == {"max-unit-params": 1_000_000}
    assert not [w for w in cfg.warnings if "unknown key" in w]


def test_pyproject_without_table_is_skipped(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.fsdplint]\nignore = ["FSDP015"]\n')
    write(tmp_path / "sub" / "pyproject.toml", '[project]\nname = "sub"\n')
    cfg = load_config(write(tmp_path / "sub" / "train.py", ""))
    assert cfg.source == (tmp_path / "pyproject.toml").absolute()
    assert cfg.ignore == ["FSDP015"]


def test_nearest_config_wins_and_fsdplint_toml_beats_pyproject(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.fsdplint]\nignore = ["FSDP015"]\n')
    write(tmp_path / "pkg" / "pyproject.toml", '[tool.fsdplint]\nignore = ["FSDP007"]\n')
    write(tmp_path / "pkg" / "fsdplint.toml", 'ignore = ["FSDP101"]\n')
    assert load_config(write(tmp_path / "pkg" / "a.py", "")).ignore == ["FSDP101"]
    assert load_config(write(tmp_path / "b.py", "")).ignore == ["FSDP015"]


def test_lookup_is_cached_per_directory(tmp_path):
    write(tmp_path / "fsdplint.toml", 'ignore = ["FSDP101"]\n')
    a = load_config(write(tmp_path / "d" / "a.py", ""))
    b = load_config(write(tmp_path / "d" / "b.py", ""))
    assert a is b


def test_unknown_keys_are_warnings_naming_key_and_file(tmp_path):
    toml = write(tmp_path / "fsdplint.toml", 'selcet = ["FSDP1"]\nline-length = 88\n')
    cfg = load_config(write(tmp_path / "t.py", ""))
    assert any("selcet" in w and str(toml.absolute()) in w and "did you mean `select`" in w for w in cfg.warnings)
    assert any("line-length" in w for w in cfg.warnings)


def test_unknown_rule_selector_is_a_warning(tmp_path):
    write(tmp_path / "fsdplint.toml", 'ignore = ["FSDP999"]\n')
    cfg = load_config(write(tmp_path / "t.py", ""))
    assert any("FSDP999" in w and "ignore" in w for w in cfg.warnings)


def test_toml_syntax_error_names_file_and_line(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.fsdplint]\nselect = ["FSDP1"\nignore = []\n')
    with pytest.raises(UsageError) as err:
        load_config(write(tmp_path / "t.py", ""))
    msg = str(err.value)
    assert msg.startswith(f"{(tmp_path / 'pyproject.toml').absolute()}:3:")
    assert "invalid TOML" in msg and "\n" not in msg


@pytest.mark.parametrize("text, needle", [
    ('select = "FSDP1"\n', "`select` in top level must be a list of strings"),
    ('per-file-ignores = { "a.py" = "FSDP1" }\n', "per-file-ignores"),
    ('target-version = "2.6"\n', "target-version"),
    ('target-version = { torch = "latest" }\n', "target-version.torch"),
    ('[rules]\nFSDP003 = 3\n', "`rules` must be a table"),
])
def test_wrong_value_types_are_clear_errors(tmp_path, text, needle):
    write(tmp_path / "fsdplint.toml", text)
    with pytest.raises(UsageError, match="fsdplint.toml: .*") as err:
        load_config(write(tmp_path / "t.py", ""))
    assert needle in str(err.value)


def test_explicit_config_is_used_for_every_file(tmp_path):
    write(tmp_path / "fsdplint.toml", 'ignore = ["FSDP101"]\n')
    other = write(tmp_path / "ci" / "strict.toml", 'select = ["ALL"]\n')
    cfg = load_config(write(tmp_path / "t.py", ""), explicit=other)
    assert cfg.select == ["ALL"] and cfg.ignore == []
    assert cfg.source == other.absolute()


def test_explicit_pyproject_reads_tool_table(tmp_path):
    py = write(tmp_path / "elsewhere" / "pyproject.toml", '[tool.fsdplint]\nignore = ["FSDP015"]\n')
    assert load_config(tmp_path, explicit=py).ignore == ["FSDP015"]


def test_missing_explicit_config_is_an_error(tmp_path):
    with pytest.raises(UsageError, match="configuration file not found"):
        load_config(tmp_path, explicit=tmp_path / "nope.toml")


def test_isolated_ignores_every_file(tmp_path):
    write(tmp_path / "fsdplint.toml", 'ignore = ["FSDP101"]\n')
    cfg = load_config(write(tmp_path / "t.py", ""), isolated=True)
    assert cfg.source is None and cfg.ignore == []


def test_per_file_ignores_and_excludes_match_globs(tmp_path):
    write(tmp_path / "fsdplint.toml", """
        extend-exclude = ["legacy", "scripts/old_*.py"]
        [per-file-ignores]
        "tests/**" = ["FSDP1"]
        "__init__.py" = ["FSDP015"]
    """)
    cfg = load_config(write(tmp_path / "t.py", ""))
    assert cfg.is_excluded(tmp_path / "legacy" / "train.py")
    assert cfg.is_excluded(tmp_path / "scripts" / "old_train.py")
    assert cfg.is_excluded(tmp_path / ".venv" / "lib" / "x.py")
    assert not cfg.is_excluded(tmp_path / "scripts" / "train.py")
    assert cfg.is_code_ignored_for("FSDP101", tmp_path / "tests" / "unit" / "test_x.py")
    assert not cfg.is_code_ignored_for("FSDP015", tmp_path / "tests" / "test_x.py")
    assert cfg.is_code_ignored_for("FSDP015", tmp_path / "pkg" / "__init__.py")
    assert not cfg.is_code_ignored_for("FSDP101", tmp_path / "train.py")


def test_exclude_replaces_defaults(tmp_path):
    write(tmp_path / "fsdplint.toml", 'exclude = ["generated"]\n')
    cfg = load_config(write(tmp_path / "t.py", ""))
    assert cfg.is_excluded(tmp_path / "generated" / "a.py")
    assert not cfg.is_excluded(tmp_path / ".venv" / "a.py")


def test_fixable_and_unfixable(tmp_path):
    write(tmp_path / "fsdplint.toml", 'fixable = ["FSDP0"]\nunfixable = ["FSDP007"]\n')
    cfg = load_config(write(tmp_path / "t.py", ""))
    assert cfg.is_fixable("FSDP015")
    assert not cfg.is_fixable("FSDP007")
    assert not cfg.is_fixable("FSDP101")
    assert load_config(tmp_path, isolated=True).is_fixable("FSDP101")


def test_rule_options_accept_code_or_name(tmp_path):
    write(tmp_path / "fsdplint.toml", '[rules.fsdp003]\nthreshold = 2\n')
    cfg = load_config(write(tmp_path / "t.py", ""))
    assert cfg.rule_options("FSDP003") == {"threshold": 2}
    assert cfg.rule_options("FSDP101") == {}


def test_unknown_distribution_in_target_version_is_a_warning(tmp_path):
    write(tmp_path / "fsdplint.toml", 'target-version = { torch = "2.6", torchh = "2.6" }\n')
    cfg = load_config(write(tmp_path / "t.py", ""))
    assert cfg.target_version == {"torch": "2.6", "torchh": "2.6"}
    assert any("`torchh`" in w and "target-version" in w for w in cfg.warnings)
    assert not any("`torch`" in w for w in cfg.warnings)
