"""Where a target version comes from, what the code proves, and what an unknown version does to a finding."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from click.testing import CliRunner

from fsdplint import behaviour, versions
from fsdplint.cli import main
from fsdplint.engine import FileConfig, Settings, lint_text

ROOT = Path(__file__).resolve().parent.parent

IGNORED_PARAMS = textwrap.dedent(
    """\
    from torch.distributed._composable.fsdp import fully_shard

    def shard(model, frozen):
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model, ignored_params=frozen)
    """
)


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


def lint(path: Path, *args: str) -> list[dict]:
    r = CliRunner().invoke(main, ["check", "--output-format", "json", "--exit-zero", *args, str(path)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def lint_src(src: str, select: str, use_installed: bool = False, **options) -> list:
    s = Settings(select=[select], isolated=True, use_installed=use_installed, prefilter=False, options=options)
    return [f for f in lint_text(textwrap.dedent(src).lstrip("\n"), "train.py", s, None, FileConfig(s, None))
            if f.code == select]


# --- precedence ----------------------------------------------------------------------------

def test_precedence_explicit_config_lock_declared(tmp_path):
    proj = write(tmp_path, {
        "pyproject.toml": '[project]\nname = "p"\ndependencies = ["torch>=2.5"]\n',
        "uv.lock": '[[package]]\nname = "torch"\nversion = "2.6.0"\n',
        "train.py": "x = 1\n",
    })
    path = proj / "train.py"
    assert versions.resolve("torch", path, {"torch": "2.8"}, {"torch": "2.7"}).source == "--target-version"
    tv = versions.resolve("torch", path, {}, {"torch": "2.7"}, "pyproject.toml")
    assert (str(tv.version), tv.kind) == ("2.7", "config")
    tv = versions.resolve("torch", path)
    assert (str(tv.version), tv.kind, tv.source) == ("2.6.0", "lock", "uv.lock: torch==2.6.0")
    (proj / "uv.lock").unlink()
    versions._declared.cache_clear()
    tv = versions.resolve("torch", path)
    assert (str(tv.version), tv.kind) == ("2.5", "declared") and tv.known


def test_requirements_above_the_project_root_do_not_count(tmp_path):
    write(tmp_path, {
        "requirements.txt": "torch==2.4.0\n",
        "proj/pyproject.toml": '[project]\nname = "p"\ndependencies = ["numpy"]\n',
        "proj/src/train.py": "x = 1\n",
    })
    tv = versions.resolve("torch", tmp_path / "proj" / "src" / "train.py", use_installed=False)
    assert tv.kind == "unknown" and not tv.known
    assert "declares no requirement" in tv.source


def test_requirements_between_file_and_root_count(tmp_path):
    write(tmp_path, {
        ".git/HEAD": "ref: refs/heads/main\n",
        "examples/fsdp/requirements.txt": "torch>=2.6\n",
        "examples/fsdp/train.py": "x = 1\n",
    })
    tv = versions.resolve("torch", tmp_path / "examples" / "fsdp" / "train.py", use_installed=False)
    assert (str(tv.version), tv.kind) == ("2.6", "declared")


def test_fsdplint_own_pyproject_declares_nothing_for_its_fixtures():
    script = ROOT / "fixtures" / "scripts" / "fsdp2_lora_after_shard_buggy.py"
    tv = versions.resolve("torch", script, use_installed=False)
    assert tv.kind == "unknown", tv


def test_unbounded_declaration_falls_through_to_installed_then_unknown(tmp_path):
    write(tmp_path, {"setup.py": 'setup(install_requires=["torch"])\n', "train.py": "x = 1\n"})
    path = tmp_path / "train.py"
    tv = versions.resolve("torch", path, use_installed=False)
    assert tv.kind == "unknown" and "has no lower bound" in tv.source
    tv = versions.resolve("torch", path)
    assert tv.kind == "installed" and "no lower bound" in tv.source


# --- what the code proves --------------------------------------------------------------------

def test_public_fsdp2_import_proves_torch_2_6_so_no_fsdp008():
    src = """
    from torch.distributed.fsdp import FSDPModule, fully_shard
    fully_shard(model)
    assert isinstance(model, FSDPModule)
    """
    assert lint_src(src, "FSDP008") == []
    # The same import on a declared torch 2.5 is the bug.
    s = Settings(select=["FSDP008"], isolated=True, use_installed=False, prefilter=False, targets={"torch": "2.5"})
    found = lint_text(textwrap.dedent(src), "t.py", s, None, FileConfig(s, None))
    assert [f.code for f in found] == ["FSDP008"] and found[0].severity.value == "error"


def test_code_evidence_makes_fsdp001_precise_and_a_warning():
    src = """
    import torch

    from torch.distributed.fsdp import FSDPModule, fully_shard
    fully_shard(model, ignored_params=frozen)
    """
    [f] = lint_src(src, "FSDP001")
    assert f.severity.value == "warning"
    assert "this module already needs torch >= 2.6 (line 3); ignored_params needs >= 2.7" in f.message
    assert "torch>=2.7" in f.message  # what to declare


def test_declared_floor_with_code_evidence_stays_an_error_and_says_both(tmp_path):
    write(tmp_path, {
        "pyproject.toml": '[project]\nname = "p"\ndependencies = ["torch>=2.4.0"]\n',
        "pkg/__init__.py": "",
        "pkg/engine.py": """\
            from torch.distributed.fsdp import fully_shard

            def shard(model, ignored):
                fully_shard(model, ignored_params=ignored)
            """,
    })
    found = {f["code"]: f for f in lint(tmp_path / "pkg" / "engine.py", "--select", "FSDP001")}
    f = found["FSDP001"]
    assert f["severity"] == "error"
    assert "already needs torch >= 2.6 (line 1)" in f["message"] and "torch>=2.4.0" in f["message"]


# --- unknown versions: warnings, unless strict ---------------------------------------------------

def test_unknown_version_is_a_warning_that_says_what_to_declare():
    [f] = lint_src(IGNORED_PARAMS, "FSDP001")
    assert f.severity.value == "warning"
    assert "unknown" in f.message and "target-version" in f.message


def test_strict_versions_makes_it_an_error(tmp_path):
    write(tmp_path, {
        "pyproject.toml": '[project]\nname = "p"\n\n[tool.fsdplint]\nstrict-versions = true\n',
        "train.py": IGNORED_PARAMS,
    })
    # The installed torch (>= 2.7 here) would decide it: pin nothing, and read no metadata either.
    from fsdplint.config import load_config

    assert load_config(tmp_path / "train.py").strict_versions is True
    s = Settings(select=["FSDP001"], use_installed=False, prefilter=False)
    path = tmp_path / "train.py"
    found = lint_text(IGNORED_PARAMS, str(path), s, path, FileConfig(s, path))
    assert [f.severity.value for f in found] == ["error"]
    assert "assumed the oldest version" in found[0].message


def test_strict_versions_must_be_a_boolean(tmp_path):
    write(tmp_path, {"pyproject.toml": '[tool.fsdplint]\nstrict-versions = "yes"\n', "train.py": "x = 1\n"})
    r = CliRunner().invoke(main, ["check", str(tmp_path / "train.py")])
    assert r.exit_code == 2 and "strict-versions" in r.output


# --- version gates are guards ------------------------------------------------------------------

def test_gates_guard_ignored_params():
    gated = [
        """
        from accelerate.utils import is_torch_version
        from torch.distributed._composable.fsdp import fully_shard
        if is_torch_version(">=", "2.7"):
            fully_shard(model, ignored_params=frozen)
        """,
        """
        import torch
        from torch.distributed._composable.fsdp import fully_shard
        if torch.__version__ >= "2.7":
            fully_shard(model, ignored_params=frozen)
        """,
        """
        import inspect
        from torch.distributed._composable.fsdp import fully_shard
        if "ignored_params" in inspect.signature(fully_shard).parameters:
            fully_shard(model, ignored_params=frozen)
        """,
        """
        from torch.distributed._composable.fsdp import fully_shard
        try:
            fully_shard(model, ignored_params=frozen)
        except (ImportError, TypeError):
            fully_shard(model)
        """,
        # A helper that refuses old torch, called first.
        """
        import torch
        from packaging import version
        from torch.distributed._composable.fsdp import fully_shard

        def require_new_torch():
            if version.parse(torch.__version__) < version.parse("2.7"):
                raise RuntimeError("needs torch >= 2.7")

        def shard(model, frozen):
            require_new_torch()
            fully_shard(model, ignored_params=frozen)
        """,
        # A plugin class whose constructor refuses old torch guards every method.
        """
        import torch
        from torch.distributed._composable.fsdp import fully_shard

        class Plugin:
            def __init__(self):
                assert torch.__version__ >= "2.7", "needs torch >= 2.7"

            def apply(self, model, frozen):
                fully_shard(model, ignored_params=frozen)
        """,
    ]
    s = dict(targets={"torch": "2.4"})
    for src in gated:
        st = Settings(select=["FSDP001"], isolated=True, use_installed=False, prefilter=False, **s)
        assert lint_text(textwrap.dedent(src), "t.py", st, None, FileConfig(st, None)) == [], src
    st = Settings(select=["FSDP001"], isolated=True, use_installed=False, prefilter=False, **s)
    assert [f.code for f in lint_text(IGNORED_PARAMS, "t.py", st, None, FileConfig(st, None))] == ["FSDP001"]


def test_gate_after_the_code_does_not_guard_it():
    src = """
    import torch
    from torch.distributed._composable.fsdp import fully_shard

    def shard(model, frozen):
        fully_shard(model, ignored_params=frozen)
        if torch.__version__ < "2.7":
            raise RuntimeError("too late")
    """
    st = Settings(select=["FSDP001"], isolated=True, use_installed=False, prefilter=False, targets={"torch": "2.4"})
    assert [f.code for f in lint_text(textwrap.dedent(src), "t.py", st, None, FileConfig(st, None))] == ["FSDP001"]


# --- a finding needs FSDP in the job -------------------------------------------------------------

PLAIN_LORA = """\
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
# Works with FSDP too (see the fsdp example), and the fsdp docs.
model = AutoModelForCausalLM.from_pretrained("org/model")
model = get_peft_model(model, LoraConfig(target_modules=["q_proj", "v_proj"]))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
"""


def test_no_finding_and_no_fix_without_fsdp_in_the_job(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(PLAIN_LORA)
    assert lint(path, "--isolated") == []
    r = CliRunner().invoke(main, ["check", "--isolated", "--fix", str(path)])
    assert r.exit_code == 0 and path.read_text() == PLAIN_LORA


def test_a_launch_config_next_to_the_script_puts_fsdp_in_the_job(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(PLAIN_LORA)
    (tmp_path / "fsdp.yaml").write_text(
        "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n")
    assert [f["code"] for f in lint(path, "--isolated", "--select", "FSDP103")] == ["FSDP103"]


def test_fsdp_in_code_opens_the_gate():
    src = PLAIN_LORA + "args = dict(fsdp='full_shard')\n"
    assert [f.code for f in lint_src(src, "FSDP103")] == ["FSDP103"]
    assert lint_src(PLAIN_LORA, "FSDP103") == []
    assert [f.code for f in lint_src(PLAIN_LORA, "FSDP103", fsdp_in_job=True)] == ["FSDP103"]


# --- library behaviour as data ------------------------------------------------------------------

def test_behaviour_entries_cite_what_was_read():
    from packaging.version import Version

    from fsdplint.launch.tools.defaults import TOOL_PACKAGES

    for key, b in behaviour.BEHAVIOURS.items():
        assert b.key == key and b.read and b.what and b.package in versions.PACKAGES + TOOL_PACKAGES
        for v in (b.since, b.until):
            assert v is None or Version(v)


def test_behaviour_holds_by_version_and_is_undecided_when_unknown():
    tv = lambda v, kind="declared": versions.TargetVersion("transformers", versions.Version(v), "x", kind)  # noqa: E731
    assert behaviour.holds("save_pretrained_gathers_dtensors", tv("4.57.1")) is True
    assert behaviour.holds("save_pretrained_gathers_dtensors", tv("5.24.0")) is False
    assert behaviour.holds("save_pretrained_gathers_dtensors", tv("4.45", "unknown")) is None
    acc = versions.TargetVersion("accelerate", versions.Version("1.7"), "x", "code")
    assert behaviour.holds("accelerate_fsdp2_requires_torch_2_6", acc) is True


# --- the README's example -----------------------------------------------------------------------

def test_readme_example_prints_what_the_readme_describes():
    readme = (ROOT / "README.md").read_text()
    assert "reports its two bugs" in readme and "FSDP101" in readme and "FSDP401" in readme
    script = ROOT / "fixtures" / "scripts" / "fsdp2_lora_after_shard_buggy.py"
    # As the README runs it (torch installed), and as the pre-commit hook does (no torch: unknown version).
    assert sorted((f["code"], f["location"]["row"]) for f in lint(script)) == [("FSDP101", 45), ("FSDP401", 67)]
    s = Settings(use_installed=False)
    found = lint_text(script.read_text(), str(script), s, script, FileConfig(s, script))
    assert sorted((f.code, f.start.row) for f in found) == [("FSDP101", 45), ("FSDP401", 67)]


# --- FSDP008 on a declared library floor --------------------------------------------------------

def test_a_job_on_accelerate_fsdp2_already_needs_torch_2_6(tmp_path):
    write(tmp_path, {
        "setup.py": 'setup(name="lib", install_requires=["torch>=2.0.0"])\n',
        "bench/fsdp2.py": """\
            from accelerate import Accelerator, FullyShardedDataParallelPlugin
            from torch.distributed.fsdp import fully_shard
            plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
            accelerator = Accelerator(fsdp_plugin=plugin)
            """,
        "bench/plain.py": """\
            from torch.distributed.fsdp import fully_shard
            fully_shard(model)
            """,
    })
    assert lint(tmp_path / "bench" / "fsdp2.py", "--select", "FSDP008", "--target-version", "accelerate=1.15.0") == []
    [f] = lint(tmp_path / "bench" / "plain.py", "--select", "FSDP008")
    assert f["severity"] == "error" and "setup.py: torch>=2.0.0" in f["message"]


def test_lazy_fsdp2_import_in_a_library_function(tmp_path):
    write(tmp_path, {
        "pyproject.toml": '[project]\nname = "lib"\ndependencies = ["torch>=2.0"]\n',
        "lib/__init__.py": "",
        "lib/utils.py": """\
            def fsdp2_prepare_model(model):
                from torch.distributed.fsdp import fully_shard
                fully_shard(model)

            def prepare(model):
                from torch.distributed.fsdp import FSDPModule
                return isinstance(model, FSDPModule)
            """,
    })
    found = lint(tmp_path / "lib" / "utils.py", "--select", "FSDP008")
    assert [(f["location"]["row"], f["severity"]) for f in found] == [(6, "warning")]


# --- a pinned release that rules out the installed version of another --------------------------

GRPO_REENTRANT = """\
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer

args = GRPOConfig(output_dir="out", gradient_checkpointing=True,
                  gradient_checkpointing_kwargs={"use_reentrant": True})
trainer = GRPOTrainer(model="org/model", reward_funcs=reward, args=args, train_dataset=ds,
                      peft_config=LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
"""


def test_installed_transformers_5_is_not_the_project_of_a_trl_pinned_before_0_29(tmp_path):
    """Measured with transformers 5.24.0 (behaviour `trl_needs_transformers_4`): trl 0.28.0 and older do not
    import their trainers, 0.29.0 does."""
    write(tmp_path, {"requirements.txt": "trl==0.15.2\n", "train.py": GRPO_REENTRANT})
    tv = lambda v, kind: versions.TargetVersion("trl", versions.Version(v), "requirements.txt", kind)  # noqa: E731
    installed = versions.TargetVersion("transformers", versions.Version("5.24.0"), "installed", "installed")
    why = behaviour.excluded_installed("transformers", installed, lambda p: tv("0.15.2", "declared"))
    assert why is not None and "trl 0.15.2" in why
    assert "trl 0.28.0" in behaviour.excluded_installed("transformers", installed, lambda p: tv("0.28.0", "declared"))
    assert behaviour.excluded_installed("transformers", installed, lambda p: tv("0.29.0", "declared")) is None
    assert behaviour.excluded_installed("transformers", installed, lambda p: tv("0.15.2", "installed")) is None
    older = versions.TargetVersion("transformers", versions.Version("4.48.0"), "installed", "installed")
    assert behaviour.excluded_installed("transformers", older, lambda p: tv("0.15.2", "declared")) is None


def test_grpo_trainer_of_trl_0_15_does_not_enable_input_grads(tmp_path):
    """trl#3089: explicit reentrant checkpointing + GRPOTrainer(peft_config=) on trl 0.15.2, no FSDP at all
    (the installed transformers 5 cannot be the project's, so its non-reentrant default does not apply)."""
    write(tmp_path, {"requirements.txt": "trl==0.15.2\n", "train.py": GRPO_REENTRANT})
    found = lint(tmp_path / "train.py", "--select", "FSDP105")
    assert [(f["code"], f["severity"]) for f in found] == [("FSDP105", "error")]
    assert "GRPOTrainer" in found[0]["message"]
    # From trl 0.17 GRPOTrainer enables input grads itself.
    newer = write(tmp_path / "newer", {"requirements.txt": "trl==0.17.0\ntransformers>=4.46,<5\n",
                                       "train.py": GRPO_REENTRANT})
    assert lint(newer / "train.py", "--select", "FSDP105") == []


def test_library_effects_and_returned_configs_name_a_behaviour_entry():
    from fsdplint.apis import CALL_EFFECTS, RETURNED_CONFIGS

    for effects in CALL_EFFECTS.values():
        for kind, on, cond, key in effects:
            assert key in behaviour.BEHAVIOURS and on in ("result", "result.model") and cond
    for kind, fields, by_version in RETURNED_CONFIGS.values():
        assert kind == "BitsAndBytesConfig" and "load_in_4bit" in fields
        assert all(key in behaviour.BEHAVIOURS for key, _ in by_version)
    # The storage entries of trl's get_quantization_config cover every release without overlap.
    keys = [key for key, _ in RETURNED_CONFIGS["trl_get_quantization_config"][2]]
    for v in ("0.7.11", "0.9.6", "0.10.0", "0.22.0", "0.23.0", "0.25.1", "0.26.0", "1.5.0"):
        tv = versions.TargetVersion("trl", versions.Version(v), "x", "declared")
        assert sum(bool(behaviour.holds(k, tv)) for k in keys) == 1, v


def test_a_library_call_that_shards_is_a_shard_event_of_the_model_it_returns():
    import libcst as cst

    from fsdplint.analysis import analyze

    src = textwrap.dedent("""\
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM, DistributedConfig
        from trl import SFTTrainer
        model = AutoModelForCausalLM.from_pretrained("m", distributed_config=DistributedConfig(fsdp_size=2, tp_size=2))
        trainer = SFTTrainer(model=model, peft_config=LoraConfig(r=8))
        """)
    a = analyze(cst.parse_module(src))
    shard, = a.events("shard2")
    lora, = a.events("lora")
    assert shard.data["implicit"] and shard.data["behaviour"] == "from_pretrained_distributed_fsdp"
    assert lora.data["behaviour"] == "trl_trainer_injects_lora"
    assert lora.entity == shard.entity  # trainer.model is the model passed in, with LoRA
