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


# -- an unverified boundary makes its finding a warning ------------------------------------------------

# Rules whose findings rest on behaviour entries (LintContext.report(rests_on=...)).
_RESTING = ("FSDP001", "FSDP004", "FSDP005", "FSDP104", "FSDP105", "FSDP107", "FSDP201", "FSDP202", "FSDP203",
            "FSDP401", "FSDP402", "FSDP501")


def _unverify(monkeypatch, keys=None):
    """The behaviour table as if its boundaries (all, or `keys`) had not been read at adjacent releases."""
    import dataclasses

    for k, b in list(behaviour.BEHAVIOURS.items()):
        if keys is None or k in keys:
            monkeypatch.setitem(behaviour.BEHAVIOURS, k, dataclasses.replace(b, since_read=(), until_read=()))


def _findings(rule, ex):
    from rule_harness import lint_example

    return [(f.start.row, f.severity.value, f.message) for f in lint_example(rule, ex) if f.code == rule.code]


def test_unverified_answer_rests_on_the_boundary_that_decides_it():
    tv = lambda v: TargetVersion("transformers", Version(v), "given", "explicit")  # noqa: E731
    b = behaviour.BEHAVIOURS["from_pretrained_legacy_kbit"]  # until 5.0.0, read at 4.57.6 and 5.0.0
    assert behaviour.unverified(b.key, tv("4.40")) == "" and behaviour.unverified(b.key, tv("5.2")) == ""
    import dataclasses

    open_ = dataclasses.replace(b, until_read=())
    try:
        behaviour.BEHAVIOURS[b.key] = open_
        assert "boundary unverified: transformers until 5.0.0" in behaviour.unverified(b.key, tv("5.2"))
        assert "until 5.0.0" in behaviour.unverified(b.key, tv("4.40"))  # True below it: it may stop earlier
        unknown = TargetVersion("transformers", Version("4.40"), "unknown", "unknown")
        assert behaviour.unverified(b.key, unknown) == ""  # an unknown version is the caller's warning already
    finally:
        behaviour.BEHAVIOURS[b.key] = b
    g = behaviour.BEHAVIOURS["trl_grpo_peft_input_grads"]  # since 0.16.0 only: the False below it rests on it
    open_g = dataclasses.replace(g, since_read=())
    try:
        behaviour.BEHAVIOURS[g.key] = open_g
        assert behaviour.unverified(g.key, TargetVersion("trl", Version("0.15.2"), "given", "explicit"))
    finally:
        behaviour.BEHAVIOURS[g.key] = g


def test_verified_entries_keep_errors_and_unverified_ones_downgrade(monkeypatch):
    """Each INVALID example of the rules that consult the behaviour table, linted with the table as read
    and again with every boundary unverified: the same findings at the same lines; an error that rests on
    a boundary becomes a warning whose message says "boundary unverified", and nothing else changes."""
    from fsdplint.registry import all_rules

    rules = [r for r in all_rules() if r.code in _RESTING]
    cases = [(r, ex) for r in rules for ex in r.INVALID]
    before = [_findings(r, ex) for r, ex in cases]
    assert all(before), "every INVALID example fires with the table as read"
    _unverify(monkeypatch)
    after = [_findings(r, ex) for r, ex in cases]
    downgraded = set()
    for (r, ex), was, now in zip(cases, before, after):
        assert [row for row, *_ in was] == [row for row, *_ in now], (r.code, ex.source())
        for (row, sev, msg), (_, sev2, msg2) in zip(was, now):
            if msg2 == msg:
                assert sev2 == sev, (r.code, msg)
                continue
            import re

            said = re.sub(r" \(boundary unverified: .*?: a warning until it is\)", "", msg2)
            assert said != msg2 and said == msg, (r.code, msg2)
            assert sev2 == ("warning" if sev == "error" else sev), (r.code, sev, sev2, msg2)
            if sev == "error":
                downgraded.add(r.code)
    # Several rules and shapes: a trl trainer's release (FSDP105), DPOTrainer's k-bit preparation (FSDP104),
    # from_pretrained's legacy keywords (FSDP202), accelerate's ignored_params (FSDP001), the DTensor gather of
    # save_pretrained (FSDP401), a launch config's setting (report_setting).
    assert {"FSDP001", "FSDP104", "FSDP105", "FSDP202", "FSDP401"} <= downgraded, downgraded


def test_tool_config_gate_is_open_on_an_unverified_boundary(monkeypatch):
    from fsdplint.launch.tools.defaults import since

    tv = TargetVersion("llamafactory", Version("0.7.1"), "given", "explicit")
    assert since("llamafactory_fsdp_8bit_refused", tv) is True
    _unverify(monkeypatch, {"llamafactory_fsdp_8bit_refused"})
    assert since("llamafactory_fsdp_8bit_refused", tv) is None


def test_api_boundaries_name_adjacent_releases_around_the_bound():
    from fsdplint.apis import BOUNDARIES

    for key, a in BOUNDARIES.items():
        assert len(a.read_at) == 2 and a.check.startswith("python bench/facts/"), key
        before, first = map(Version, a.read_at)
        assert before < Version(a.since) <= first, (key, a.read_at, a.since)


def _project(tmp_path, files):
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


_NORM_HELPER = '''import torch


def clip_grad_norm_(parameters, max_norm, foreach=None):
    grads = [p.grad for p in parameters if p.grad is not None]
    total_norm = torch.nn.utils.get_total_norm(grads, 2.0, False, foreach)
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total_norm, foreach)
    return total_norm
'''
_NORM_TRAIN = '''import torch
from torch.distributed._composable.fsdp import fully_shard
import utils


def train(model, batches):
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    for x in batches:
        model(x).sum().backward()
        grad_norm = utils.clip_grad_norm_(list(model.parameters()), 1.0, foreach=True)
        print(grad_norm.item())
'''


@pytest.mark.parametrize("declared, expect", [
    (None, "warning"),            # nothing declared or installed: an unknown torch
    ("torch==2.6.0", "warning"),  # below the oldest release measured with a Replicate norm
    ("torch==2.13.0", None),      # measured: .item() is the global norm
])
def test_fsdp501_honours_the_torch_the_project_implies(tmp_path, declared, expect):
    """torchtitan#766's shape: a helper in another module returns get_total_norm over FSDP2 grads and the
    script logs .item(). The torch version is the project's (declared), else what its code proves; never
    the linting machine's when the test says not to use it."""
    from fsdplint.engine import Settings, lint_files

    files = {"utils.py": _NORM_HELPER, "train.py": _NORM_TRAIN}
    if declared:
        files["requirements.txt"] = declared + "\n"
    root = _project(tmp_path, files)
    s = Settings(select=["FSDP501"], use_installed=False, use_cache=False, options={"project_root": str(root)})
    files = [str(root / n) for n in ("train.py", "utils.py")]
    found = [f for r in lint_files(files, s) for f in r.findings if f.code == "FSDP501"]
    if expect is None:
        assert found == [], [f.message for f in found]
        return
    assert [f.severity.value for f in found] == [expect], [f.message for f in found]
    assert "declare torch >= 2.13" in found[0].message
    if declared is None:  # (the helper's get_total_norm proves torch >= 2.6 in utils.py only, not in train.py)
        assert "unknown" in found[0].message, found[0].message


def test_get_total_norm_proves_torch_2_6():
    """torch.nn.utils.get_total_norm is public from torch 2.6.0 (read at 2.5.1 and 2.6.0): a module that
    calls it unguarded already needs that release."""
    from test_versions import lint_src

    src = """
        import torch
        from torch.distributed._composable.fsdp import fully_shard
        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()], 2.0)
        print(norm.item())
    """
    found = lint_src(src, "FSDP501")
    assert [f.severity.value for f in found] == ["warning"], [f.message for f in found]
    assert "2.6" in found[0].message and "get_total_norm" in found[0].message, found[0].message
