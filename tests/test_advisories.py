"""The advisory database: every entry loads, fires at an affected release and not at the fixed one."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from packaging.version import Version

from fsdplint.advisories import load
from fsdplint.advisories.model import load_file
from fsdplint.errors import UsageError
from fsdplint.registry import all_rules
from fsdplint.rule import Invalid, Valid
from rule_harness import lint_example

RULE = next(r for r in all_rules() if r.code == "FSDP601")
ADVISORIES = load()


def _example(adv, version, cls=Valid, **kw):
    ex = adv.example
    target = {adv.library: str(version), **dict(ex.get("target", {}))}
    return cls(ex["code"], target=target, options=dict(ex.get("options", {})), **kw)


def _last_affected(adv):
    affected = [Version(b.release) for b in adv.boundaries if b.affected]
    return max(affected) if affected else adv.introduced


def _hits(adv, example):
    return [f for f in lint_example(RULE, example) if f.code == "FSDP601" and adv.id in f.message]


def test_unverified_alone_is_a_warning():
    adv = next(a for a in ADVISORIES if a.id == "bitsandbytes-8bit-optim-fsdp2-dtensor")
    found = _hits(adv, _example(adv, "0.50.2"))
    assert found and all(f.severity.value == "warning" for f in found)


def test_enough_entries_load():
    assert ADVISORIES and len({a.id for a in ADVISORIES}) == len(ADVISORIES)


@pytest.mark.parametrize("adv", ADVISORIES, ids=lambda a: a.id)
def test_fires_at_affected_release(adv):
    version = _last_affected(adv)
    assert version is not None and adv.applies_to(version), f"{adv.id}: no affected release read"
    found = _hits(adv, _example(adv, version))
    assert found, f"{adv.id} did not fire at {adv.library} {version}"
    assert adv.example["line"] in [f.start.row for f in found]
    f = found[0]
    own = f.message[f.message.index(adv.id):].split(" Also ")[0]  # this advisory's part of the finding
    if adv.verified and adv.severity == "error":
        assert f.severity.value == "error"
    elif adv.severity == "warning":
        assert "degrades the run" in own
    else:
        assert "not confirmed" in own  # an unverified entry only ever warns
    if adv.fixed:
        assert f"Fixed in {adv.library} {adv.fixed}" in own


@pytest.mark.parametrize("adv", [a for a in ADVISORIES if a.fixed], ids=lambda a: a.id)
def test_silent_at_fixed_release(adv):
    assert not _hits(adv, _example(adv, adv.fixed))


@pytest.mark.parametrize("adv", [a for a in ADVISORIES if a.introduced], ids=lambda a: a.id)
def test_silent_before_introduced(adv):
    before = max((Version(b.release) for b in adv.boundaries if not b.affected and Version(b.release) < adv.introduced),
                 default=None)
    if before is None:
        pytest.skip("no release before the introducing one was read")
    assert not _hits(adv, _example(adv, before))


@pytest.mark.parametrize("text,needle", [
    ('id = "x"\n', "missing field"),
    ('this is = not toml', "invalid TOML"),
])
def test_malformed_entry_is_one_line_error(tmp_path, text, needle):
    p = tmp_path / "x.toml"
    p.write_text(text)
    with pytest.raises(UsageError) as e:
        load_file(p)
    assert str(p) in str(e.value) and needle in str(e.value) and "\n" not in str(e.value)


def test_verified_entry_needs_both_adjacent_releases(tmp_path):
    src = next(a for a in ADVISORIES if a.verified and a.fixed).source
    from fsdplint.advisories.model import DATA

    text = (DATA / src).read_text()
    # Drop the boundary read at the fixed release: the entry can no longer claim to be verified.
    cut = text.split("[[boundaries]]")
    kept = [c for c in cut[1:] if "affected = false" not in c]
    p = tmp_path / src
    p.write_text(cut[0] + "".join("[[boundaries]]" + c for c in kept))
    with pytest.raises(UsageError, match="verified"):
        load_file(p)


def test_unknown_fact_rejected(tmp_path):
    from fsdplint.advisories.model import DATA

    src = ADVISORIES[0].source
    p = tmp_path / src
    p.write_text((DATA / src).read_text().replace("[when]\n", "[when]\nfsdp_versoin = 1\n"))
    with pytest.raises(UsageError, match="unknown fact 'fsdp_versoin'"):
        load_file(p)


def test_cli_lists_advisories():
    from fsdplint.cli import main

    r = CliRunner().invoke(main, ["advisories", "--output-format", "json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert {row["id"] for row in rows} == {a.id for a in ADVISORIES}
    r = CliRunner().invoke(main, ["advisories", "--target-version", "bitsandbytes=0.49.2"])
    assert r.exit_code == 0 and "bitsandbytes-8bit-optim-state-fsdp1" not in r.output
    r = CliRunner().invoke(main, ["advisories", "--target-version", "bitsandbytes=0.49.1"])
    assert "bitsandbytes-8bit-optim-state-fsdp1" in r.output


def test_toggle_of_a_model_not_wrapped_here_only_warns():
    adv = next(a for a in ADVISORIES if a.id == "peft-adapter-toggle-non-leaf-fsdp")
    code = """
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
policy = FSDP(policy_model, use_orig_params=True)
with reward_model.disable_adapter():
    scores = reward_model(**batch)
"""
    found = _hits(adv, Valid(code, target={"peft": "0.18.1"}))
    assert found and all(f.severity.value == "warning" for f in found)
    fixed = _hits(adv, Valid(code, target={"peft": "0.19.0"}))
    assert not fixed


def test_setting_written_under_an_undecidable_if_only_warns():
    adv = next(a for a in ADVISORIES if a.id == "accelerate-fsdp2-ram-efficient-loading-cpu-offload")
    code = """
import os
from accelerate import Accelerator
def setup(cfg):
    os.environ["ACCELERATE_USE_FSDP"] = "true"
    os.environ["FSDP_VERSION"] = "2"
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "true"
    if cfg.offload_params:
        os.environ["FSDP_OFFLOAD_PARAMS"] = "true"
    return Accelerator().prepare(model)
"""
    found = _hits(adv, Valid(code, target={"accelerate": "1.12.0"}))
    assert found and all(f.severity.value == "warning" for f in found)
    certain = code.replace("    if cfg.offload_params:\n        os.environ", "    os.environ")
    found = _hits(adv, Valid(certain, target={"accelerate": "1.12.0"}))
    assert found and all(f.severity.value == "error" for f in found)


def test_facts_of_different_tests_do_not_combine():
    adv = next(a for a in ADVISORIES if a.id == "peft-trainable-tokens-fsdp-state-dict")
    code = """
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

def test_trainable_tokens_save(tmp_path):
    config = LoraConfig(target_modules=["q_proj"], trainable_token_indices={"embed_tokens": [0]})
    get_peft_model(model, config).save_pretrained(tmp_path)

def test_fsdp_wrap():
    FSDP(model, use_orig_params=True)
"""
    assert not _hits(adv, Valid(code, target={"peft": "0.16.0"}))
    same_test = code.replace("    get_peft_model(model, config).save_pretrained(tmp_path)",
                             "    FSDP(get_peft_model(model, config)).module.save_pretrained(tmp_path)")
    assert _hits(adv, Valid(same_test, target={"peft": "0.16.0"}))


def test_cli_project_requirements_decide(tmp_path):
    from fsdplint.cli import main

    (tmp_path / "requirements.txt").write_text("accelerate==1.13.0\nbitsandbytes==0.49.1\n")
    r = CliRunner().invoke(main, ["advisories", str(tmp_path), "--output-format", "json"])
    assert r.exit_code == 0, r.output
    ids = {row["id"] for row in json.loads(r.output)}
    assert "bitsandbytes-8bit-optim-state-fsdp1" in ids
    assert "accelerate-fsdp2-ignored-params-old-torch" not in ids  # fixed in 1.13.0
