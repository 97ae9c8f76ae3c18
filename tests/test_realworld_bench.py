"""bench/realworld: every case is well-formed, and the scorer scores a small case end to end."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

from fsdplint.registry import rules_by_code

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "realworld"
RUN = BENCH / "run.py"

FIELDS = {"id", "title", "source", "expect", "covered", "shape", "setup", "notes"}
# Codes being added with the project-wide analysis (issue 16); cases may already expect them.
NEW_CODES = {"FSDP018", "FSDP019", "FSDP114", "FSDP115", "FSDP403", "FSDP404"}
ID_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
SHA_RE = re.compile(r"^[0-9a-f]{40}$")


def _handwritten():
    for case_toml in sorted((BENCH / "cases").glob("*/case.toml")):
        with case_toml.open("rb") as fh:
            yield case_toml.parent, tomllib.load(fh)


def _manifest():
    for manifest in sorted(BENCH.glob("manifest*.toml")):
        with manifest.open("rb") as fh:
            for entry in tomllib.load(fh).get("case", []):
                yield manifest, entry


def _check_common(case: dict, where: str, known: set[str]) -> None:
    missing = FIELDS - case.keys()
    assert not missing, f"{where}: missing {sorted(missing)}"
    assert ID_RE.match(case["id"]), f"{where}: id {case['id']!r} is not kebab-case"
    assert isinstance(case["title"], str) and case["title"].strip(), where
    assert isinstance(case["source"], list) and case["source"], f"{where}: no source"
    for url in case["source"]:
        assert re.match(r"^https://\S+$", url), f"{where}: source {url!r} is not a URL"
    assert isinstance(case["expect"], list), where
    unknown = set(case["expect"]) - known
    assert not unknown, f"{where}: unknown rule codes {sorted(unknown)}"
    assert isinstance(case["covered"], bool), where
    if case["covered"]:
        assert case["expect"], f"{where}: a covered case names the codes that catch it"
    else:
        assert not case["expect"], f"{where}: an uncovered case has no rule to expect"
    assert isinstance(case["shape"], list) and case["shape"], where
    assert case["setup"] in ("python", "outside-python"), where
    assert isinstance(case["notes"], str) and len(case["notes"].split()) >= 15, f"{where}: notes too thin"
    assert set(case.get("fixed_true_findings", [])) <= known, where


def test_every_case_is_well_formed():
    known = set(rules_by_code()) | NEW_CODES
    ids = []
    handwritten = list(_handwritten())
    for case_dir, case in handwritten:
        where = str(case_dir.relative_to(ROOT))
        _check_common(case, where, known)
        assert case["id"] == case_dir.name, f"{where}: id differs from the directory name"
        bug = case_dir / "bug"
        assert bug.is_dir() and any(p.is_file() for p in bug.rglob("*")), f"{where}: empty or no bug/"
        fixed = case_dir / "fixed"
        if fixed.exists():
            assert any(p.is_file() for p in fixed.rglob("*")), f"{where}: empty fixed/"
        ids.append(case["id"])
    manifest = list(_manifest())
    for path, case in manifest:
        where = f"{path.name} [{case.get('id')}]"
        _check_common(case, where, known)
        assert re.match(r"^[\w.-]+/[\w.-]+$", case["repo"]), where
        assert SHA_RE.match(case["bug_commit"]), f"{where}: bug_commit is not a full SHA"
        if "fix_commit" in case:
            assert SHA_RE.match(case["fix_commit"]), f"{where}: fix_commit is not a full SHA"
            assert case["fix_commit"] != case["bug_commit"], where
        assert isinstance(case["paths"], list), where
        assert all(isinstance(p, str) and not p.startswith("/") and ".." not in p for p in case["paths"]), where
        ids.append(case["id"])
    assert len(ids) == len(set(ids)), f"duplicate ids: {sorted({i for i in ids if ids.count(i) > 1})}"
    assert len(handwritten) >= 1 and len(manifest) >= 1


def test_scorer_is_stdlib_only_and_never_imports_fsdplint():
    tree = ast.parse(RUN.read_text(encoding="utf-8"))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    assert modules - stdlib <= {"tomli"}, f"non-stdlib imports: {sorted(modules - stdlib)}"
    assert "fsdplint" not in modules


BUG = textwrap.dedent(
    """\
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
    """
)
FIXED = textwrap.dedent(
    """\
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")
    model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    """
)
CASE = textwrap.dedent(
    """\
    id = "tiny-lora-after-fully-shard"
    title = "LoRA injected after fully_shard"
    source = ["https://example.org/report/1"]
    expect = ["FSDP101"]
    covered = true
    shape = ["single-script"]
    setup = "python"
    notes = "A small handwritten case used only to exercise the scorer end to end from the test suite."
    """
)
MANIFEST = textwrap.dedent(
    """\
    [[case]]
    id = "absent-repo-case"
    title = "a repository that has no local copy"
    source = ["https://example.org/report/2"]
    repo = "nobody/nothing"
    bug_commit = "0123456789abcdef0123456789abcdef01234567"
    paths = []
    expect = ["FSDP101"]
    covered = true
    shape = ["single-script"]
    setup = "python"
    notes = "Absent on purpose: the scorer must report it as skipped, never drop it silently."
    """
)


def _scorer(*args, cwd):
    cmd = [sys.executable, str(RUN), "--fsdplint", f"{sys.executable} -m fsdplint", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_scorer_scores_a_small_case_end_to_end(tmp_path):
    bench = tmp_path / "bench"
    case = bench / "cases" / "tiny-lora-after-fully-shard"
    (case / "bug").mkdir(parents=True)
    (case / "fixed").mkdir()
    (case / "case.toml").write_text(CASE)
    (case / "bug" / "train.py").write_text(BUG)
    (case / "fixed" / "train.py").write_text(FIXED)
    (bench / "manifest.toml").write_text(MANIFEST)
    repos = tmp_path / "repos"
    repos.mkdir()

    out_json, out_md = tmp_path / "out.json", tmp_path / "results.md"
    proc = _scorer("--bench", str(bench), "--repos", str(repos), "--json", str(out_json),
                   "--output", str(out_md), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out_json.read_text())
    rows = {r["id"]: r for r in report["cases"]}
    assert set(rows) == {"tiny-lora-after-fully-shard", "absent-repo-case"}

    tiny = rows["tiny-lora-after-fully-shard"]
    assert tiny["status"] in ("caught", "missed")
    assert tiny["kind"] == "handwritten" and tiny["expect"] == ["FSDP101"]
    assert all(re.match(r"^FSDP\d{3}:(error|warning|info)$", f) for f in tiny["found"])
    assert isinstance(tiny["false_alarms"], list)  # the fixed/ tree was linted too
    assert (tiny["status"] == "caught") == any(f.startswith("FSDP101:") for f in tiny["found"])

    absent = rows["absent-repo-case"]
    assert absent["status"] == "skipped" and "no local copy" in absent["reason"]

    totals = report["totals"]
    assert totals["cases"] == 2 and totals["covered"] == 1 and totals["skipped"] == ["absent-repo-case"]
    md = out_md.read_text()
    assert "Recall" in md and "tiny-lora-after-fully-shard" in md and "absent-repo-case" in md


def test_scorer_rejects_a_malformed_case_in_one_line(tmp_path):
    case = tmp_path / "bench" / "cases" / "broken"
    (case / "bug").mkdir(parents=True)
    (case / "case.toml").write_text('id = "broken"\ntitle = "no other fields"\n')
    proc = _scorer("--bench", str(tmp_path / "bench"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "case.toml" in proc.stderr and "missing field" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_scorer_rejects_unknown_only_ids(tmp_path):
    proc = _scorer("--only", "no-such-case", "--output", str(tmp_path / "r.md"), cwd=tmp_path)
    assert proc.returncode == 2 and "no-such-case" in proc.stderr
