"""The project view: imports between the project's own modules, summaries of their functions applied at
call sites, classes, findings that name their other half, and the fact-sheet cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import libcst as cst
import pytest
from click.testing import CliRunner

from fsdplint.analysis import analyze
from fsdplint.analysis.index import Project, fact_sheet, find_root
from fsdplint.cli import main

FSDPLINT = shutil.which("fsdplint", path=os.path.dirname(sys.executable)) or shutil.which("fsdplint") or "fsdplint"

LOAD = """
    import torch
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model


    def load_model(name):
        model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
        return model
"""
WRAP = """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


    def setup_fsdp(model):
        return FSDP(model, use_orig_params=True)
"""
TRAIN = """
    import torch
    {imports}


    def main():
        model = {load}("x")
        model = {wrap}(model)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)


    main()
"""


def write(root: Path, files: dict) -> None:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))


def run(root: Path, *args: str, cache: bool = True) -> list[dict]:
    extra = ["--cache-dir", str(root / "cache")] if cache else ["--no-cache"]
    r = CliRunner().invoke(main, ["check", "--isolated", "--output-format", "json", "--exit-zero", *extra, *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def codes(found, filename=None) -> list[str]:
    return sorted(f["code"] for f in found if filename is None or f["filename"] == filename)


# -- the index -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["absolute", "relative", "src", "reexport", "module", "sibling"])
def test_imports_of_the_project_resolve_to_its_files(project, layout):
    base = "src/pkg" if layout == "src" else "pkg"
    imports = {
        "absolute": ("from pkg.model_utils import load_model\nfrom pkg.fsdp import setup_fsdp", "load_model", "setup_fsdp"),
        "relative": ("from .model_utils import load_model\nfrom .fsdp import setup_fsdp", "load_model", "setup_fsdp"),
        "src": ("from pkg.model_utils import load_model\nfrom pkg.fsdp import setup_fsdp", "load_model", "setup_fsdp"),
        "reexport": ("from pkg import load_model, setup_fsdp", "load_model", "setup_fsdp"),
        "module": ("import pkg.model_utils as mu\nfrom pkg import fsdp", "mu.load_model", "fsdp.setup_fsdp"),
        "sibling": ("from model_utils import load_model\nfrom fsdp import setup_fsdp", "load_model", "setup_fsdp"),
    }[layout]
    init = "from .model_utils import load_model\nfrom .fsdp import setup_fsdp\n" if layout == "reexport" else ""
    train = TRAIN.format(imports=textwrap.indent(imports[0], "    ").lstrip(), load=imports[1], wrap=imports[2])
    write(project, {f"{base}/__init__.py": init, f"{base}/model_utils.py": LOAD, f"{base}/fsdp.py": WRAP,
                    f"{base}/train.py": train})
    found = run(project, f"{base}/train.py")
    # FSDP501: the clip in train.py is under the FSDP1 wrap of fsdp.py; FSDP005: the bf16 base loaded and
    # LoRA-injected in model_utils.py (adapters upcast to fp32) is wrapped in one FSDP1 unit.
    assert {"FSDP501", "FSDP005"} <= set(codes(found)), found
    assert {f["filename"] for f in found} == {f"{base}/train.py"}  # the other modules are read, not reported
    alone = run(project, "--no-project", f"{base}/train.py")
    assert "FSDP501" not in codes(alone) and "FSDP005" not in codes(alone)


def test_library_names_never_resolve_into_the_project(project):
    # A project that vendors a library (or is one) does not turn library calls into project code.
    write(project, {"torch/distributed/fsdp/__init__.py": "def FullyShardedDataParallel(m):\n    return m.to('cpu')\n"})
    p = Project(project)
    assert p.resolve(project / "train.py", [["FSDP", "torch.distributed.fsdp", "FullyShardedDataParallel", 0]], "FSDP") is None


def test_root_is_found_from_markers(tmp_path):
    write(tmp_path, {"repo/setup.cfg": "", "repo/a/b/c.py": ""})
    assert find_root(tmp_path / "repo/a/b/c.py") == (tmp_path / "repo").resolve()


def test_fact_sheet_is_plain_data():
    sheet = fact_sheet(textwrap.dedent(LOAD) + "\nclass T:\n    def save(self):\n        self.model.save_pretrained('o')\n")
    assert json.loads(json.dumps(sheet)) == sheet
    assert sheet["functions"]["load_model"]["touches"]
    assert sheet["classes"]["T"]["methods"]["save"]["touches"]
    assert ["get_peft_model", "peft", "get_peft_model", 0] in sheet["imports"]


def test_a_script_without_trigger_words_is_linted_through_its_imports(project):
    # train.py names no FSDP/LoRA API itself: the prefilter must still see model_utils.py and fsdp.py.
    write(project, {"model_utils.py": LOAD, "fsdp.py": WRAP, "train.py": """
        from model_utils import load_model
        from fsdp import setup_fsdp

        model = setup_fsdp(load_model("x"))
    """})
    found = run(project, "train.py")
    assert "FSDP003" in codes(found), found  # the wrap without a policy, at the call in train.py
    assert run(project, "--no-project", "train.py") == []


# -- star imports ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["sibling", "relative", "package"])
def test_names_bound_by_a_star_import_reach_the_module_that_defines_them(project, layout):
    # `from utils import *` is how many example scripts reach their helpers: they are inlined as if
    # imported by name, from a sibling module, a relative one, or a package whose __init__ star-re-exports.
    imports = {
        "sibling": "from model_utils import *\n    from fsdp import *",
        "relative": "from .model_utils import *\n    from .fsdp import *",
        "package": "from pkg import *",
    }[layout]
    init = "from .model_utils import *\nfrom .fsdp import *\n" if layout == "package" else ""
    base = "" if layout == "package" else "pkg/"
    write(project, {"pkg/__init__.py": init, "pkg/model_utils.py": LOAD, "pkg/fsdp.py": WRAP,
                    f"{base}train.py": TRAIN.format(imports=imports, load="load_model", wrap="setup_fsdp")})
    found = run(project, f"{base}train.py")
    assert {"FSDP501", "FSDP005"} <= set(codes(found)), found
    assert {f["filename"] for f in found} == {f"{base}train.py"}
    alone = run(project, "--no-project", f"{base}train.py")
    assert "FSDP501" not in codes(alone) and "FSDP005" not in codes(alone)


def test_star_import_binds_what_dunder_all_lists_else_the_public_names(project):
    listed = "__all__ = ['other']\n" + textwrap.dedent(LOAD) + "\n\ndef other():\n    return None\n"
    private = textwrap.dedent(LOAD).replace("def load_model", "def _load_model")
    write(project, {"listed.py": listed, "private.py": private, "plain.py": LOAD})
    p = Project(project.resolve())
    importer = (project / "train.py").resolve()

    def star(module, name):
        return p.resolve(importer, [["*", module, "*", 0]], name)

    assert star("plain", "load_model") == ((project / "plain.py").resolve(), "load_model")
    assert star("listed", "load_model") is None  # defined there, but `import *` does not bind it
    assert star("listed", "other") == ((project / "listed.py").resolve(), "other")
    assert star("private", "_load_model") is None
    # An explicit import of the same name, later or earlier, wins over the star import.
    assert p.resolve(importer, [["*", "plain", "*", 0], ["load_model", "private", "_load_model", 0]],
                     "load_model") == ((project / "private.py").resolve(), "_load_model")


def test_dunder_all_is_read_when_literal():
    assert fact_sheet("__all__ = ['a', 'b']\n__all__ += ('c',)\n__all__.append('d')\n")["all"] == ["a", "b", "c", "d"]
    assert "all" not in fact_sheet("def a():\n    pass\n")
    # Built at run time: unknown, so every public name counts.
    assert "all" not in fact_sheet("from .x import __all__ as _x\n__all__ = _x + ['a']\n")


def test_a_script_reaching_its_helpers_only_by_star_import_is_linted(project):
    # No trigger word in train.py, and no name to follow but the star import: the prefilter must still
    # let the project view read model_utils.py and fsdp.py.
    write(project, {"model_utils.py": LOAD, "fsdp.py": WRAP, "train.py": """
        from model_utils import *
        from fsdp import *

        model = setup_fsdp(load_model("x"))
    """})
    assert "FSDP003" in codes(run(project, "train.py"))
    assert run(project, "--no-project", "train.py") == []


COMMON = """
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    {all}

    def seed(n):
        torch.manual_seed(n)
"""
STAR_TRAIN = """
    from transformers import AutoModelForCausalLM
    from common import *

    model = AutoModelForCausalLM.from_pretrained("m")
    model = FSDP(model)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
"""


def test_library_names_a_star_imported_module_imports_are_the_library_here_too(project):
    # common.py imports torch and FSDP; `from common import *` binds them in train.py as well.
    write(project, {"common.py": COMMON.format(all=""), "train.py": STAR_TRAIN})
    assert {"FSDP003", "FSDP501"} <= set(codes(run(project, "train.py")))
    # With `__all__` listing only `seed`, the star import binds neither name: the calls stay unknown.
    write(project, {"common.py": COMMON.format(all="__all__ = ['seed']")})
    assert not {"FSDP003", "FSDP501"} & set(codes(run(project, "train.py")))
    # A definition of the script's own shadows the star-imported name.
    write(project, {"common.py": COMMON.format(all=""),
                    "train.py": STAR_TRAIN + "\n\ndef FSDP(model):\n    return model\n"})
    assert "FSDP003" not in codes(run(project, "train.py"))


def test_star_imports_that_import_each_other_stay_bounded(project):
    write(project, {"a.py": "from b import *\n", "b.py": "from a import *\n", "train.py": """
        import torch
        from a import *

        model = build(model)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """})
    found = run(project, "train.py")
    assert all(f["code"] not in ("FSDP900", "FSDP901") for f in found), found
    assert Project(project.resolve()).resolve((project / "train.py").resolve(), [["*", "a", "*", 0]], "build") is None


# -- summaries applied at call sites ------------------------------------------------------------------


def test_events_of_another_module_carry_their_file(project):
    write(project, {"model_utils.py": LOAD, "fsdp.py": WRAP,
                    "train.py": TRAIN.format(imports="from model_utils import load_model\n    from fsdp import setup_fsdp",
                                             load="load_model", wrap="setup_fsdp")})
    p = Project(project.resolve())
    path = (project / "train.py").resolve()
    a = analyze(cst.parse_module(path.read_text()), project=p, path=path)
    (t,) = a.timelines
    by_kind = {e.kind: e for e in t.events}
    assert by_kind["wrap1"].step.origin.path.name == "fsdp.py"
    assert by_kind["lora"].step.origin.path.name == "model_utils.py"
    assert by_kind["clip"].step.origin is None
    # One model through the helpers' returns: loaded, LoRA-injected and wrapped elsewhere, clipped here.
    assert by_kind["lora"].entity == by_kind["wrap1"].entity == by_kind["clip"].entity
    assert t.wrap_state(by_kind["clip"].entity, by_kind["clip"].seq) == "fsdp1"
    # peft's default upcast of the adapters is a fact on the event (apis.CALL_FACTS).
    assert by_kind["lora"].data.get("adapter_dtype") == "float32"
    assert by_kind["wrap1"].step.site.func == "setup_fsdp"


def test_adapter_upcast_fact_is_off_with_autocast_disabled():
    a = analyze(cst.parse_module(
        "from peft import get_peft_model\nm = get_peft_model(model, cfg, autocast_adapter_dtype=False)\n"
        "n = get_peft_model(model, cfg)\n"))
    data = [e.data.get("adapter_dtype") for e in a.events("lora")]
    assert data == [None, "float32"]


def test_unknown_and_recursive_callees_stay_unknown(project):
    write(project, {"loop.py": """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def a(model):
            return b(FSDP(model))

        def b(model):
            return a(model)
    """, "train.py": """
        import torch
        from loop import a
        from elsewhere import shard

        model = shard(a(model))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """})
    found = run(project, "train.py")
    assert "FSDP501" in codes(found)
    assert all(f["code"] not in ("FSDP900", "FSDP901") for f in found)


def test_trainer_class_with_self_model(project):
    write(project, {"trainer.py": """
        import torch
        from accelerate import Accelerator
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from transformers import AutoModelForCausalLM


        class MyTrainer:
            def __init__(self, name):
                self.accelerator = Accelerator()
                model = AutoModelForCausalLM.from_pretrained(name)
                self.model = FSDP(model)

            @property
            def is_chief(self):
                return self.accelerator.is_main_process

            def train_step(self, batch):
                self.model(**batch).loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)

            def save(self):
                if self.is_chief:
                    torch.save(self.model.state_dict(), "m.pt")
    """})
    found = run(project, "trainer.py")
    rows = {f["code"]: f["location"]["row"] for f in found}
    assert rows.get("FSDP501") == 19  # the wrap in __init__ reaches train_step through self.model
    assert rows.get("FSDP401") == 23  # `self.is_chief` is a property returning is_main_process


def test_rank_guard_behind_a_helper_function(project):
    write(project, {"save.py": """
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def chief():
            return dist.get_rank() == 0

        model = FSDP(model)
        if chief():
            torch.save(model.state_dict(), "m.pt")
    """})
    assert "FSDP401" in codes(run(project, "save.py"))


def test_a_second_name_for_the_model(project):
    write(project, {"model_utils.py": LOAD, "train.py": """
        import torch
        from model_utils import load_model
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        model = load_model("x")
        net = model
        wrapped = FSDP(net)
        torch.nn.utils.clip_grad_norm_(wrapped.parameters(), 1.0)
    """})
    found = run(project, "train.py")
    assert {"FSDP005", "FSDP501"} <= set(codes(found)), found


def test_parameter_annotated_with_fsdp_is_wrapped(project):
    write(project, {"loop.py": """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def train(model: FSDP, loader):
            for batch in loader:
                model(batch).loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """})
    p = Project(project.resolve())
    a = analyze(cst.parse_module((project / "loop.py").read_text()), project=p, path=project / "loop.py")
    (t,) = a.timelines
    clip = t.of("clip")[0]
    assert t.wrap_state(clip.entity, clip.seq) == "fsdp1"


# -- the other half, in every output format ---------------------------------------------------------------


@pytest.fixture
def split(project):
    write(project, {"model_utils.py": LOAD, "fsdp.py": WRAP,
                    "train.py": TRAIN.format(imports="from model_utils import load_model\n    from fsdp import setup_fsdp",
                                             load="load_model", wrap="setup_fsdp")})
    return project


def _invoke(*args):
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--no-cache", "--select", "FSDP003", *args])
    assert r.exit_code == 0, r.output
    return r.stdout


def test_related_location_in_text_formats(split):
    for fmt in ("concise", "full"):
        out = _invoke("--output-format", fmt, "train.py")
        assert "train.py:8:13: FSDP003" in out
        assert "= fsdp.py:5:12: in setup_fsdp(): return FSDP(model, use_orig_params=True)" in out, out


def test_related_location_in_json_formats(split):
    (f,) = json.loads(_invoke("--output-format", "json", "train.py"))
    assert f["location"]["row"] == 8 and f["filename"] == "train.py"
    assert f["related"] == [{"filename": "fsdp.py", "location": {"row": 5, "column": 12},
                             "end_location": {"row": 5, "column": 45},
                             "message": "in setup_fsdp(): return FSDP(model, use_orig_params=True)"}]
    (line,) = _invoke("--output-format", "json-lines", "train.py").splitlines()
    assert json.loads(line)["related"] == f["related"]


def test_related_location_in_github_and_junit(split):
    gh = _invoke("--output-format", "github", "train.py")
    assert "fsdp.py:5:12: in setup_fsdp()" in gh and "file=train.py,line=8" in gh
    junit = _invoke("--output-format", "junit", "train.py")
    assert "fsdp.py:5:12: in setup_fsdp(): return FSDP(model, use_orig_params=True)" in junit


def test_related_location_in_sarif_validates(split):
    from test_output_sarif import SCHEMA

    if not SCHEMA.is_file():
        pytest.skip("the SARIF 2.1.0 schema is not available")
    jsonschema = pytest.importorskip("jsonschema")
    log = json.loads(_invoke("--output-format", "sarif", "train.py"))
    jsonschema.validators.validator_for(json.loads(SCHEMA.read_text())).check_schema
    schema = json.loads(SCHEMA.read_text())
    jsonschema.validators.validator_for(schema)(schema).validate(log)
    (res,) = log["runs"][0]["results"]
    (rel,) = res["relatedLocations"]
    assert rel["physicalLocation"]["artifactLocation"]["uri"] == "fsdp.py"
    assert rel["physicalLocation"]["region"]["startLine"] == 5
    assert res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "train.py"


def test_noqa_at_the_call_site_silences_the_finding(split):
    text = (split / "train.py").read_text().replace('model = setup_fsdp(model)', 'model = setup_fsdp(model)  # noqa: FSDP003')
    (split / "train.py").write_text(text)
    assert json.loads(_invoke("--output-format", "json", "train.py")) == []


# -- the cache --------------------------------------------------------------------------------------------


def _entries(root: Path) -> list[Path]:
    """The modules' fact sheets (the findings cache keeps its own entries beside them)."""
    return sorted(p for p in (root / "cache").rglob("*.json") if "sheets" in p.parts)


def test_cache_hit_and_invalidation(split):
    first = _fresh(split, "train.py")
    entries = _entries(split)
    assert len(entries) == 2  # the fact sheets of model_utils.py and fsdp.py
    stamps = [p.stat().st_mtime_ns for p in entries]
    assert _fresh(split, "train.py") == first
    assert [p.stat().st_mtime_ns for p in entries] == stamps  # read, not rewritten
    # A change to fsdp.py: a new entry for its new content, and the finding follows the change.
    (split / "fsdp.py").write_text((split / "fsdp.py").read_text().replace("FSDP(model, use_orig_params=True)", "model"))
    after = _fresh(split, "train.py")
    assert len(_entries(split)) == 3
    assert "FSDP501" in codes(first) and "FSDP501" not in codes(after)



def test_a_helper_changed_between_two_lints_in_one_process(split):
    """A long-lived process (an editor, a watcher): the second lint reads the helper's new text, not the
    parse of the old one that the first lint made."""
    assert "FSDP501" in codes(run(split, "train.py", cache=False))
    (split / "fsdp.py").write_text((split / "fsdp.py").read_text().replace("FSDP(model, use_orig_params=True)", "model"))
    assert "FSDP501" not in codes(run(split, "train.py", cache=False))


def test_every_script_of_a_large_project_sees_the_helpers_it_calls(project):
    """More linted files than the parses kept per process: the helpers' findings reach each caller alike."""
    files = {"model_utils.py": LOAD, "fsdp.py": WRAP}
    for i in range(140):
        files[f"train_{i:03}.py"] = TRAIN.format(imports="from model_utils import load_model\n    from fsdp import setup_fsdp",
                                                 load="load_model", wrap="setup_fsdp")
    write(project, files)
    found = run(project, "--jobs", "1", ".", cache=False)
    assert {f["filename"] for f in found if f["code"] == "FSDP501"} == {f"train_{i:03}.py" for i in range(140)}


def test_no_cache_writes_nothing(split):
    run(split, "train.py", cache=False)
    assert not (split / "cache").exists() and not (split / ".fsdplint_cache").exists()


def test_default_cache_dir_ignores_itself(split):
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "train.py"])
    assert r.exit_code == 0
    assert (split / ".fsdplint_cache" / ".gitignore").read_text().strip().endswith("*")


def _fresh(root: Path, *args: str) -> list[dict]:
    """A run in a new process (the in-process memo of a previous run does not hide the cache)."""
    p = subprocess.run([FSDPLINT, "check", "--isolated", "--exit-zero", "--output-format", "json",
                        "--cache-dir", str(root / "cache"), *args], cwd=root, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_corrupt_entry_is_a_miss(split):
    first = _fresh(split, "train.py")
    for p in (split / "cache").rglob("*.json"):  # the fact sheets and the findings cache's own entries
        p.write_text("{not json")
    assert _fresh(split, "train.py") == first
    assert all(json.loads(p.read_text())["v"] for p in _entries(split))  # rewritten


def test_two_concurrent_runs(split):
    cmd = [FSDPLINT, "check", "--isolated", "--exit-zero", "--output-format", "json",
           "--cache-dir", str(split / "cache"), "train.py"]
    procs = [subprocess.Popen(cmd, cwd=split, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert json.loads(outs[0][0]) == json.loads(outs[1][0]) == run(split, "train.py", cache=False)
    assert not list((split / "cache").rglob(".tmp-*"))


def test_argument_values_and_the_project_view_together(project):
    # argparse values decide branches while the project's other modules are read: a test that reads the
    # name it decides (`model is None`), and values asked for before the timelines exist.
    write(project, {"utils.py": """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def wrap(model):
            return FSDP(model)
    """, "train.py": """
        import argparse
        import torch
        from utils import wrap

        p = argparse.ArgumentParser()
        p.add_argument("--shard", action="store_true")
        args = p.parse_args()
        model = build()
        if args.shard and model is not None:
            model = wrap(model)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """})
    off = run(project, "train.py", cache=False)
    on = run(project, "--launch", "python train.py --shard", "train.py", cache=False)
    for found in (off, on):
        assert all(f["code"] not in ("FSDP900", "FSDP901") for f in found), found
    assert "FSDP501" not in codes(off) and "FSDP501" in codes(on), on


def test_a_finding_from_another_module_is_placed_at_the_call_that_runs_it_that_way(project):
    # The helper runs twice: on every rank (fine), then under a rank-0 guard (a hang). The finding names the
    # second call, whose guard it reports, not the first call of the helper.
    write(project, {"ckpt.py": """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        def snapshot(model):
            return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    """, "train.py": """
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        from ckpt import snapshot

        fully_shard(model)
        first = snapshot(model)
        if dist.get_rank() == 0:
            last = snapshot(model)
    """})
    found = [f for f in run(project, "train.py", cache=False) if f["code"] == "FSDP401"]
    assert [f["location"]["row"] for f in found] == [8], found
    assert found[0]["related"][0]["filename"].endswith("ckpt.py")


def test_modules_two_hops_away_do_not_crowd_out_a_helper_the_script_calls(project):
    # `prepare` (one hop) calls into five modules of its own (two hops); the script's later call into
    # `export` (one hop) must still be read: it gathers DTensor shards, and the script calls it on rank 0 only.
    files = {f"pkg/deep{i}.py": f"""
        def step{i}(model):
            model.requires_grad_(True)
        """ for i in range(5)}
    files["pkg/prep.py"] = "".join(f"from pkg.deep{i} import step{i}\n" for i in range(5)) + (
        "\n\ndef prepare(model):\n" + "".join(f"    step{i}(model)\n" for i in range(5)))
    files["pkg/export.py"] = """
        import torch


        def export(moments, path):
            out = {k: v.full_tensor() for k, v in moments.items()}
            torch.save(out, path)
        """
    files["train.py"] = """
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard
        from pkg.prep import prepare
        from pkg.export import export

        model = prepare(model)
        fully_shard(model)
        if dist.get_rank() == 0:
            export(moments, "m.pt")
        """
    write(project, files)
    found = [f for f in run(project, "train.py", cache=False) if f["code"] == "FSDP401"]
    assert [f["location"]["row"] for f in found] == [9]


# -- objects followed into the classes that keep them ----------------------------------------------

SCORER = """
    class Scorer:
        def __init__(self, lm, tokenizer):
            self.lm = lm
            self.tokenizer = tokenizer

        def loglik(self, ids):
            return self.lm(ids).logits.log_softmax(-1)
"""


def test_a_folder_without_markers_is_linted_as_one_project(tmp_path, monkeypatch):
    """`fsdplint check DIR` on a script folder with no pyproject/setup/.git: its modules import each other,
    so the pre-wrap model handed to the other module's class is followed there."""
    write(tmp_path, {"scorer.py": SCORER, "train.py": """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from scorer import Scorer

        fsdp_model = FSDP(model, auto_wrap_policy=policy)
        train(fsdp_model)
        scorer = Scorer(model, tokenizer)
    """})
    monkeypatch.chdir(tmp_path)
    found = run(tmp_path, str(tmp_path), cache=False)
    rows = [(Path(f["filename"]).name, f["location"]["row"]) for f in found if f["code"] == "FSDP018"]
    assert rows == [("train.py", 6)]


def test_the_wrapped_model_handed_on_is_not_stale(project):
    write(project, {"scorer.py": SCORER, "train.py": """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from scorer import Scorer

        fsdp_model = FSDP(model, auto_wrap_policy=policy)
        train(fsdp_model)
        scorer = Scorer(fsdp_model, tokenizer)
    """})
    assert "FSDP018" not in codes(run(project, "train.py"))


TWO_PASS = """
    import torch


    class TwoPass(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, x):
            {first}
            self.lm.disable_adapter_layers()
            return self.lm(inputs_embeds=hidden)
"""
WRAP_TWO_PASS = """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from two_pass import TwoPass

    model = FSDP(TwoPass(lm), auto_wrap_policy=policy, use_orig_params=True)
"""


@pytest.mark.parametrize("first, reported", [
    ("hidden = self.lm(inputs_embeds=x).hidden_states[-1]", True),
    ("with torch.no_grad():\n                hidden = self.lm(inputs_embeds=x).hidden_states[-1]", False),
])
def test_adapter_toggle_in_the_forward_of_a_class_of_another_module(project, first, reported):
    """FSDP114 follows the wrapped module's class into its module: adapters disabled after a gradient-tracking
    pass, and still disabled at backward, fail FSDP1's post-backward check; after a no_grad pass they do not."""
    write(project, {"two_pass.py": TWO_PASS.replace("{first}", first), "train.py": WRAP_TWO_PASS})
    found = [f for f in run(project, "train.py") if f["code"] == "FSDP114"]
    if reported:
        assert [f["location"]["row"] for f in found] == [4]
        assert "two_pass.py" in found[0]["message"]
    else:
        assert found == []


# -- one parse per module in a run over the project ------------------------------------------------------

# Helper modules that are linted too: the caller reaches `setup_fsdp` in `shared.py`, whose own
# `train_here` has a finding of its own, and `unused` is code the caller never reaches.
SHARED = """
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from transformers import AutoModelForCausalLM


    def unused(model):
        return model.half()


    def setup_fsdp(model):
        return FSDP(model, use_orig_params=True)


    def train_here():
        model = AutoModelForCausalLM.from_pretrained("x")
        model = setup_fsdp(model)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)


    train_here()
"""


@pytest.fixture(params=["caller first", "caller last"])
def shared(project, request):
    """`train.py` sorts before its helpers or after them (then the run still lints it first)."""
    caller, helper = ("a_", "z_") if request.param == "caller first" else ("z_", "a_")
    imports = f"from {helper}model_utils import load_model\n    from {helper}shared import setup_fsdp"
    write(project, {f"{helper}model_utils.py": LOAD, f"{helper}shared.py": SHARED,
                    f"{caller}train.py": TRAIN.format(imports=imports, load="load_model", wrap="setup_fsdp")})
    return project, caller, helper


def _parses(monkeypatch) -> list[str]:
    seen: list[str] = []
    parse = cst.parse_module

    def counting(source, *args, **kwargs):
        seen.append(source)
        return parse(source, *args, **kwargs)

    monkeypatch.setattr(cst, "parse_module", counting)
    return seen


def test_a_module_reached_before_its_own_turn_gives_the_findings_of_a_fresh_parse(shared):
    """Linting the project in one process reuses the parse that the caller's analysis made of a helper for
    the helper's own lint: the same findings as each file linted in a worker process of its own (`--jobs 2`,
    which parses each file afresh; a finding caused in a linted helper is reported there either way)."""
    root, caller, helper = shared
    together = run(root, "--jobs", "1", ".", cache=False)
    p = subprocess.run([sys.executable, "-m", "fsdplint", "check", "--isolated", "--exit-zero", "--output-format",
                        "json", "--no-cache", "--jobs", "2", "."], cwd=root, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert p.returncode == 0, p.stderr
    alone = json.loads(p.stdout)
    assert together == alone  # in the order the files were given, not the order they were linted
    assert "FSDP501" in codes(together, f"{caller}train.py") and "FSDP501" in codes(together, f"{helper}shared.py")


def test_each_module_is_parsed_once_in_a_run_over_the_project(shared, monkeypatch):
    root, caller, helper = shared
    seen = _parses(monkeypatch)
    run(root, "--jobs", "1", ".", cache=False)
    texts = [(root / n).read_text() for n in (f"{caller}train.py", f"{helper}model_utils.py", f"{helper}shared.py")]
    assert sorted(seen) == sorted(texts)  # whole, once each: no partial parse of a helper, no second parse


def test_a_file_linted_alone_parses_only_the_part_of_a_helper_it_reaches(shared, monkeypatch):
    """One changed file (pre-commit): the helper is not linted in this run, so only what the call reaches
    is parsed (the definitions it never runs are blanked out)."""
    root, caller, helper = shared
    seen = _parses(monkeypatch)
    assert "FSDP501" in codes(run(root, f"{caller}train.py", cache=False))
    part = [s for s in seen if "def setup_fsdp" in s]
    assert len(part) == 1 and "def unused" not in part[0] and "def train_here" not in part[0]


def test_a_helper_sorted_far_before_its_caller_is_still_parsed_once(project, monkeypatch):
    """More parsed files between a helper and its caller than the parses kept per process: the run lints the
    caller before the modules it imports, so the helper's parse is made once, for both."""
    files = {"a_shared.py": SHARED, "a_model_utils.py": LOAD,
             "z_train.py": TRAIN.format(imports="from a_model_utils import load_model\n    from a_shared import setup_fsdp",
                                        load="load_model", wrap="setup_fsdp")}
    for i in range(140):
        files[f"m_{i:03}.py"] = "from torch.distributed.fsdp import fully_shard\n"
    write(project, files)
    seen = _parses(monkeypatch)
    found = run(project, "--jobs", "1", ".", cache=False)
    assert "FSDP501" in codes(found, "z_train.py") and "FSDP501" in codes(found, "a_shared.py")
    assert seen.count((project / "a_shared.py").read_text()) == 1
    assert not [s for s in seen if "def setup_fsdp" in s and s != (project / "a_shared.py").read_text()]
