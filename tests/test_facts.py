"""The facts behind the rules stay true: docs/facts.md is current, every recorded boundary names its two
adjacent releases, and the cheap CPU measurements still show what the rules say."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from fsdplint import behaviour, facts_page
from fsdplint.registry import all_rules
from fsdplint.versions import TargetVersion

REPO = Path(__file__).resolve().parents[1]


def _bench(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / "facts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_facts_page_is_current():
    assert facts_page.facts_path().read_text(encoding="utf-8") == facts_page.render(), \
        "docs/facts.md is stale; run `python -m fsdplint.docs_gen`"


@pytest.mark.parametrize("key", sorted(behaviour.BEHAVIOURS))
def test_recorded_boundaries_are_adjacent_releases_around_the_bound(key):
    b = behaviour.BEHAVIOURS[key]
    for bound, pair in ((b.since, b.since_read), (b.until, b.until_read)):
        if not pair:
            continue
        assert bound is not None and len(pair) == 2, (key, pair)
        # `first` is above the bound only where the index lacks the release the entry cites (trl 0.10.0).
        before, first = map(Version, pair)
        assert before < Version(bound) <= first, (key, pair, bound)


def test_unrecorded_boundaries_say_unverified_on_the_page():
    page = facts_page.render()
    for key in facts_page.unverified_boundaries():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{key}` |"))
        assert "unverified" in row, row


def test_rule_facts_name_their_evidence():
    for r in all_rules():
        for f in r.facts:
            assert f.kind in ("measured", "read", "cited"), (r.code, f)
            if f.kind == "measured":
                assert f.command.startswith("python bench/facts/"), (r.code, f)
                assert (REPO / f.command.split()[1]).is_file(), (r.code, f.command)
            if f.kind == "read":
                assert len(f.read_at) == 2, (r.code, f)


def test_release_bisect_finds_the_first_release_of_a_monotone_predicate():
    bisect = _bench("release_bisect")
    versions = ["0.9.0", "0.10.0", "0.15.2", "0.16.0", "0.16.1", "1.0.0"]
    read = []

    def holds(v):
        read.append(v)
        return Version(v) >= Version("0.16.0")

    assert bisect.bisect(versions, holds, linear=False, log=lambda _: None) == ("0.15.2", "0.16.0")
    assert len(read) <= 3  # binary, not every release
    assert bisect.bisect(versions, holds, linear=True, log=lambda _: None) == ("0.15.2", "0.16.0")
    assert bisect.bisect(versions, lambda v: False, linear=False, log=lambda _: None) == ("1.0.0", None)
    assert bisect.bisect(versions, lambda v: True, linear=False, log=lambda _: None) == (None, "0.9.0")


def test_clip_grad_norm_measurement_matches_fsdp501(monkeypatch):
    """FSDP1: the torch function's norm differs per rank (FSDP501 errors); FSDP2 on the installed torch: the
    behaviour table says whether .item() is the global norm, and the run must agree."""
    import os

    # The spawned ranks import the worker by module name.
    facts_dir = str(REPO / "bench" / "facts")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (facts_dir, os.environ.get("PYTHONPATH")) if p))
    monkeypatch.syspath_prepend(facts_dir)
    import fsdp501_cpu_check

    res = fsdp501_cpu_check.run()
    ranks = res["ranks"]
    true = ranks[0]["true"]
    assert all(r["fsdp1_torch_fn"] < true * 0.99 for r in ranks)  # each rank's partial norm
    assert ranks[0]["fsdp1_torch_fn"] != ranks[1]["fsdp1_torch_fn"]
    assert all(abs(r["fsdp1_method"] - true) < 1e-4 * true for r in ranks)
    installed = TargetVersion("torch", Version(res["torch"].split("+")[0]), "installed", "installed")
    if behaviour.holds("fsdp2_clip_norm_replicated", installed):
        assert all(r["fsdp2_item"] == r["true"] for r in ranks), ranks
        assert all(r["foreach_item"] == r["true"] for r in ranks), ranks  # torchtitan's foreach=True path
    assert all(abs(r["fsdp2_full"] - true) < 1e-4 * true for r in ranks)
