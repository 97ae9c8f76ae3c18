"""bench/realworld: every case is well-formed, and the scorer scores a small case end to end."""

from __future__ import annotations

import ast
import json
import os
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


# A LoRA model handed to accelerate: FSDP comes only from the launch config, and whether one unit may mix
# frozen and trainable parameters (use_orig_params=True) depends on the torch version (FSDP004 on torch 2.0).
LORA_PREPARE = textwrap.dedent(
    """\
    import torch
    from accelerate import Accelerator
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    accelerator = Accelerator()
    base = AutoModelForCausalLM.from_pretrained("facebook/opt-350m", torch_dtype=torch.float16)
    model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    """
)
ORIG_PARAMS_YAML = "distributed_type: FSDP\nmixed_precision: fp16\nfsdp_config:\n  fsdp_use_orig_params: true\n"
NO_ORIG_PARAMS_YAML = "distributed_type: FSDP\nmixed_precision: fp16\n"


def _case_toml(case_id: str, setup: str, extra: str = "") -> str:
    return textwrap.dedent(
        f"""\
        id = "{case_id}"
        title = "a LoRA model prepared by accelerate, FSDP from the reported launch"
        source = ["https://example.org/report/{case_id}"]
        expect = ["FSDP004"]
        covered = true
        shape = ["single-script"]
        setup = "{setup}"
        notes = "A small case used only to exercise the reported-setup fields of the scorer from the test suite."
        """
    ) + extra


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org",
                               "HOME": str(repo), "PATH": "/usr/bin:/bin"}).stdout.strip()


def test_scorer_scores_a_reported_setup_and_the_tree_as_it_stood(tmp_path):
    bench = tmp_path / "bench"
    # Handwritten: the launch config the report shows is a file of bug/, named in reported_files.
    case = bench / "cases" / "lora-prepare-reported-config"
    (case / "bug").mkdir(parents=True)
    (case / "case.toml").write_text(_case_toml("lora-prepare-reported-config", "outside-python",
                                               'reported_files = ["fsdp.yaml"]\n'))
    (case / "bug" / "train.py").write_text(LORA_PREPARE)
    (case / "bug" / "fsdp.yaml").write_text(NO_ORIG_PARAMS_YAML)
    # Manifest: a repository without its launch; the launch line, an overlay and the torch version come
    # from the report. Only the version makes the tree wrong (use_orig_params=True on torch 2.0).
    repo = tmp_path / "repos" / "someone+proj"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "train.py").write_text(LORA_PREPARE)
    (repo / "README.md").write_text("accelerate launch --config_file fsdp.yaml train.py\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "bug")
    commit = _git(repo, "rev-parse", "HEAD")
    overlay = bench / "reported" / "proj-lora"
    overlay.mkdir(parents=True)
    (overlay / "fsdp.yaml").write_text(ORIG_PARAMS_YAML)
    (bench / "manifest.toml").write_text(
        "[[case]]\n" + _case_toml("proj-lora", "outside-python", textwrap.dedent(
            f"""\
            repo = "someone/proj"
            bug_commit = "{commit}"
            paths = ["train.py"]
            reported_launch = ["accelerate launch --config_file fsdp.yaml train.py"]
            reported_paths = ["README.md"]
            reported_overlay = "reported/proj-lora"
            reported_versions = {{ torch = "2.0.1" }}
            """))
    )
    out_json, out_md = tmp_path / "out.json", tmp_path / "results.md"
    proc = _scorer("--bench", str(bench), "--repos", str(tmp_path / "repos"), "--json", str(out_json),
                   "--output", str(out_md), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out_json.read_text())
    rows = {r["id"]: r for r in report["cases"]}
    hand, mani = rows["lora-prepare-reported-config"], rows["proj-lora"]
    assert hand["reported_setup"] == ["files"]
    assert hand["status"] == "caught" and hand["as_stood"]["status"] == "missed"
    assert mani["reported_setup"] == ["launch", "paths", "overlay", "versions"]
    assert mani["status"] == "caught" and mani["as_stood"]["status"] == "missed"
    assert "FSDP004:error" in mani["found"] and not mani["as_stood"].get("found")
    totals = report["totals"]
    assert (totals["caught"], totals["covered"]) == (2, 2)
    assert (totals["as_stood"]["caught"], totals["as_stood"]["covered"]) == (0, 2)
    md = out_md.read_text()
    assert "Recall as the trees stood" in md and "0/2" in md and "2/2" in md
    assert "proj-lora (launch, paths, overlay, versions)" in md
    # The case files were not touched: the as-stood pass removed the reported file from its own copy only.
    assert (case / "bug" / "fsdp.yaml").is_file()


def test_reported_overlay_never_replaces_a_repository_file(tmp_path):
    bench = tmp_path / "bench"
    repo = tmp_path / "repos" / "someone+proj"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "train.py").write_text(LORA_PREPARE)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "bug")
    overlay = bench / "reported" / "proj-clash"
    overlay.mkdir(parents=True)
    (overlay / "train.py").write_text("print('not the reporter's script')\n")
    (bench / "manifest.toml").write_text("[[case]]\n" + _case_toml("proj-clash", "python", textwrap.dedent(
        f"""\
        repo = "someone/proj"
        bug_commit = "{_git(repo, 'rev-parse', 'HEAD')}"
        paths = []
        reported_overlay = "reported/proj-clash"
        """)))
    out_json = tmp_path / "out.json"
    proc = _scorer("--bench", str(bench), "--repos", str(tmp_path / "repos"), "--json", str(out_json),
                   "--output", str(tmp_path / "r.md"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out_json.read_text())["cases"]
    assert row["status"] == "error" and "would replace a file of the repository" in row["reason"]


def test_malformed_reported_fields_are_rejected_in_one_line(tmp_path):
    bench = tmp_path / "bench"
    case = bench / "cases" / "bad-reported"
    (case / "bug").mkdir(parents=True)
    (case / "bug" / "train.py").write_text(LORA_PREPARE)
    for extra, message in (
        ('reported_files = ["fsdp.yaml"]\n', "which bug/ does not hold"),
        ('reported_paths = ["launch"]\n', "reported_paths is for manifest cases"),
        ('reported_launch = "accelerate launch train.py"\n', "reported_launch must be a non-empty list"),
        ('reported_versions = { torch = 2 }\n', "reported_versions must be a table"),
    ):
        (case / "case.toml").write_text(_case_toml("bad-reported", "python", extra))
        proc = _scorer("--bench", str(bench), cwd=tmp_path)
        assert proc.returncode == 2, extra
        assert message in proc.stderr and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_reported_fields_name_what_the_benchmark_holds():
    """Every `reported_*` field of the real cases is well-formed, and the overlays they name exist."""
    for case_dir, case in _handwritten():
        for name in case.get("reported_files", []):
            for tree in ("bug", "fixed"):
                if (case_dir / tree).is_dir():
                    assert (case_dir / tree / name).is_file(), f"{case_dir.name}: {tree}/{name}"
        assert "reported_overlay" not in case and "reported_paths" not in case, case_dir.name
    for manifest, case in _manifest():
        assert "reported_files" not in case, case["id"]
        if "reported_overlay" in case:
            assert (manifest.parent / case["reported_overlay"]).is_dir(), case["id"]
        for cmd in case.get("reported_launch", []):
            assert isinstance(cmd, str) and cmd.strip(), case["id"]


def test_reported_patch_edits_a_repository_file_in_both_passes_only_when_reported(tmp_path):
    # The repository holds its launch config; the report says one line was added to it in place.
    bench = tmp_path / "bench"
    repo = tmp_path / "repos" / "someone+proj"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "train.py").write_text(LORA_PREPARE)
    (repo / "fsdp.yaml").write_text("mixed_precision: fp16\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "bug")
    commit = _git(repo, "rev-parse", "HEAD")
    reported = bench / "reported" / "proj-edit"
    reported.mkdir(parents=True)
    (reported / "edit.diff").write_text(textwrap.dedent(
        """\
        diff --git a/fsdp.yaml b/fsdp.yaml
        --- a/fsdp.yaml
        +++ b/fsdp.yaml
        @@ -1 +1,2 @@
        +distributed_type: FSDP
         mixed_precision: fp16
        """))
    (reported / "stale.diff").write_text(textwrap.dedent(
        """\
        diff --git a/fsdp.yaml b/fsdp.yaml
        --- a/fsdp.yaml
        +++ b/fsdp.yaml
        @@ -1,2 +1,3 @@
         distributed_type: MULTI_GPU
         mixed_precision: fp16
        +downcast_bf16: 'no'
        """))
    cases = ""
    for case_id, patch in (("proj-edit", "edit.diff"), ("proj-stale", "stale.diff")):
        cases += "[[case]]\n" + _case_toml(case_id, "outside-python", textwrap.dedent(
            f"""\
            repo = "someone/proj"
            bug_commit = "{commit}"
            paths = []
            reported_launch = ["accelerate launch --config_file fsdp.yaml train.py"]
            reported_patch = "reported/proj-edit/{patch}"
            """)) + "\n"
    (bench / "manifest.toml").write_text(cases)
    out_json = tmp_path / "out.json"
    proc = _scorer("--bench", str(bench), "--repos", str(tmp_path / "repos"), "--json", str(out_json),
                   "--output", str(tmp_path / "r.md"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {r["id"]: r for r in json.loads(out_json.read_text())["cases"]}
    edit, stale = rows["proj-edit"], rows["proj-stale"]
    assert edit["reported_setup"] == ["launch", "patch"]
    # FSDP (and so the mixed requires_grad unit) comes only from the patched line.
    assert edit["status"] == "caught" and "FSDP004:error" in edit["found"]
    assert edit["as_stood"]["status"] == "missed"
    assert stale["status"] == "error" and "reported_patch does not apply" in stale["reason"]
    # The repository's own file is untouched by the run.
    assert "distributed_type" not in (repo / "fsdp.yaml").read_text()


STUB_MAIN = """
import json, sys
if "--help" in sys.argv:
    print("--output-format --no-cache --exit-zero")
elif "--version" in sys.argv:
    print("stub 0")
else:
    print(json.dumps([{"code": "FSDP101", "severity": "error", "filename": "train.py",
                       "location": {"row": 1, "column": 1}, "message": "from the stub"}]))
"""


def test_a_relative_pythonpath_names_the_checkout_not_the_copied_tree(tmp_path):
    # `PYTHONPATH=. run.py --fsdplint "python -m fsdplint"` from a checkout: the lint runs inside the copied
    # tree, so a relative entry must still name the checkout's package (here a stub that finds FSDP101),
    # not fall back to the installed fsdplint.
    bench = tmp_path / "bench"
    case = bench / "cases" / "tiny-lora-after-fully-shard"
    (case / "bug").mkdir(parents=True)
    (case / "case.toml").write_text(CASE)
    (case / "bug" / "train.py").write_text("print('nothing to find')\n")
    checkout = tmp_path / "checkout"
    (checkout / "fsdplint").mkdir(parents=True)
    (checkout / "fsdplint" / "__init__.py").write_text("")
    (checkout / "fsdplint" / "__main__.py").write_text(STUB_MAIN)
    out_json = tmp_path / "out.json"
    cmd = [sys.executable, str(RUN), "--fsdplint", f"{sys.executable} -m fsdplint", "--bench", str(bench),
           "--json", str(out_json), "--output", str(tmp_path / "results.md")]
    env = dict(os.environ, PYTHONPATH=".")
    proc = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {r["id"]: r for r in json.loads(out_json.read_text())["cases"]}
    assert rows["tiny-lora-after-fully-shard"]["found"] == ["FSDP101:error"]


def test_third_held_out_set_keeps_its_size_and_its_working_trees():
    """manifest-held3.toml is a measure (issue 24): at least 15 buggy jobs configured outside Python, at least six
    of them with the fix commit whose tree is a working example, and none of its reports reused by another case."""
    held3 = [case for path, case in _manifest() if path.name == "manifest-held3.toml"]
    assert len(held3) >= 15
    assert all(case["id"].startswith("held3-") for case in held3)
    assert all(case["setup"] == "outside-python" for case in held3)
    assert sum("fix_commit" in case for case in held3) >= 6
    assert sum(case["covered"] for case in held3) >= 5
    others = [case for path, case in _manifest() if path.name != "manifest-held3.toml"]
    others += [case for _, case in _handwritten()]
    cited = {url.rstrip("/") for case in others for url in case["source"]}
    for case in held3:
        reused = {url.rstrip("/") for url in case["source"]} & cited
        assert not reused, f"{case['id']}: {sorted(reused)} is already a case of the benchmark"


def test_fourth_held_out_set_is_disjoint_from_every_earlier_case_and_keeps_its_working_trees():
    """manifest-held4.toml is the fourth measure (issue 24): buggy jobs configured outside Python, each from a
    report no earlier case uses, covered cases in the majority, and the fix commit on most of them."""
    held4 = [case for path, case in _manifest() if path.name == "manifest-held4.toml"]
    assert len(held4) >= 11
    assert all(case["id"].startswith("held4-") for case in held4)
    assert all(case["setup"] == "outside-python" for case in held4)
    assert sum("fix_commit" in case for case in held4) >= 6
    assert sum(case["covered"] for case in held4) >= 6
    others = [case for path, case in _manifest() if path.name != "manifest-held4.toml"]
    others += [case for _, case in _handwritten()]
    cited = {url.rstrip("/") for case in others for url in case["source"]}
    for case in held4:
        reused = {url.rstrip("/") for url in case["source"]} & cited
        assert not reused, f"{case['id']}: {sorted(reused)} is already a case of the benchmark"
