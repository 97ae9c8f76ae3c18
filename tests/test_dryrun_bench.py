"""bench/dryrun: every case of the manifest is well formed and runnable as written, and results.md
reports the cases the manifest has (no job is run here)."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

from fsdplint.registry import rules_by_code

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "dryrun"
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
URL_RE = re.compile(r"^https://\S+")
LAUNCHERS = ("python ", "torchrun ", "accelerate launch ", "bash ", "trl ", "axolotl ", "llamafactory-cli ")


def _cases() -> list[dict]:
    return tomllib.loads((BENCH / "manifest.toml").read_text(encoding="utf-8"))["case"]


def _runner():
    spec = importlib.util.spec_from_file_location("dryrun_run", BENCH / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _launch_words(case: dict) -> list[str]:
    words = case["launch"].split()
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # an environment prefix
        words = words[1:]
    return words


def test_every_case_is_well_formed():
    known = set(rules_by_code())
    runner = _runner()
    ids = [c["id"] for c in _cases()]
    assert len(ids) == len(set(ids)), f"duplicate ids: {sorted({i for i in ids if ids.count(i) > 1})}"
    for case in _cases():
        where = f"manifest.toml [{case['id']}]"
        assert re.match(r"^[a-z0-9]+(_[a-z0-9]+)*$", case["id"]), f"{where}: id is not snake_case"
        assert case["expect"] == "clean" or case["expect"] in known, f"{where}: unknown expect {case['expect']!r}"
        assert " ".join(_launch_words(case)).startswith(LAUNCHERS), f"{where}: launch {case['launch']!r}"
        for key in ("source", "also"):
            value = case.get(key)
            if isinstance(value, str) and value.startswith("http"):
                assert URL_RE.match(value), f"{where}: {key} {value!r} is not an https URL"
        if case["expect"] != "clean":
            assert case.get("source"), f"{where}: a buggy case names the report or launch it reproduces"
        for sizes in (case.get("hub_configs") or {}).values():
            assert sizes in runner.HUB_CONFIGS, f"{where}: no published config named {sizes!r}"
        if case.get("model"):
            assert case["model"] == "llama70b", where
        assert case.get("until", "step") in ("step", "save"), f"{where}: until is `fsdplint run --until`'s value"
        if case.get("repo"):  # an official example, extracted at run time
            assert re.match(r"^[\w.-]+/[\w.-]+$", case["repo"]), where
            assert SHA_RE.match(case["commit"]), f"{where}: commit is not a full SHA"
            assert case["paths"] and all(not p.startswith("/") and ".." not in p for p in case["paths"]), where
            assert not (BENCH / "cases" / case["id"]).exists(), f"{where}: official code is never copied in"
            if case["expect"] != "clean":
                assert isinstance(case.get("file"), str) and isinstance(case.get("line"), int), \
                    f"{where}: a buggy official case names the file and line where the job fails"
            continue
        d = BENCH / "cases" / case["id"]
        assert d.is_dir(), f"{where}: no cases/{case['id']}"
        scored = d / case.get("file", "train.py")
        assert scored.is_file(), f"{where}: no {scored.name}"
        marks = [i for i, line in enumerate(scored.read_text(encoding="utf-8").splitlines(), 1) if "# BUG" in line]
        if case["expect"] == "clean":
            assert not marks, f"{where}: a known-good job has no # BUG line"
        else:
            assert len(marks) == 1 or case.get("line"), f"{where}: exactly one # BUG line, got {marks}"
        script = next((w for w in _launch_words(case) if w.endswith(".py")), None)
        if script:
            assert (d / case.get("cwd", ".") / script).is_file(), f"{where}: the launch names {script}, not in the case"
        for w in _launch_words(case):  # a config file the launch names ships with the case
            if w.endswith((".yaml", ".yml", ".json")):
                assert (d / w).is_file(), f"{where}: the launch names {w}, not in the case"


def test_every_case_directory_is_in_the_manifest():
    listed = {c["id"] for c in _cases() if not c.get("repo")}
    on_disk = {p.name for p in (BENCH / "cases").iterdir() if p.is_dir()}
    assert on_disk == listed, f"not in the manifest: {sorted(on_disk - listed)}; missing: {sorted(listed - on_disk)}"


def test_results_report_the_latest_full_pass_of_every_case():
    cases = _cases()
    text = (BENCH / "results.md").read_text(encoding="utf-8")
    latest = text.rsplit("\n## ", 1)[-1]
    missing = [c["id"] for c in cases if not re.search(rf"\b{re.escape(c['id'])}\b", latest)]
    assert not missing, f"the latest section of results.md does not report {missing}"
    buggy = sum(c["expect"] != "clean" for c in cases)
    assert f"{len(cases)} cases, {buggy} buggy and {len(cases) - buggy} known to work" in latest
