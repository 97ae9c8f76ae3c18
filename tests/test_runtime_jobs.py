"""fsdplint.check inside real 2-process torchrun jobs (gloo, CPU, FSDP2 and FSDP1, peft LoRA).

The scenario job runs once per session; each test reads what every rank saw.
Every launch has a timeout, so a rank stuck in a collective fails the test.
"""

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("transformers")

import torch.distributed as dist  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is required", allow_module_level=True)

JOBS = Path(__file__).parent / "runtime_jobs"
LAUNCH_TIMEOUT = 240
FINDING_KEYS = {"code", "name", "severity", "filename", "location", "end_location", "message", "url", "fix", "notes"}


def torchrun(script, *args, cwd):
    """Run `script` on 2 ranks; returns (returncode, output). Kills the whole job on timeout."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    proc = subprocess.Popen(
        cmd + [str(a) for a in args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{script.name} did not finish within {LAUNCH_TIMEOUT}s (a rank hung):\n{out[-4000:]}")
    return proc.returncode, out


SCENARIOS = [
    "correct",
    "after_eval_forward",
    "lora_after_wrap",
    "forgot_root_unit",
    "ignored_trainable",
    "stale_optimizer",
    "diverged_hsdp",
    "same_init_hsdp",
    "diverged_before_wrap",
    "different_rank_configs",
    "mixed_dtype",
    "qlora_fsdp2",
    "empty_rank_shards",
    "replicated_adapter_synced",
    "fsdp1_peft_policy",
    "fsdp1_late_lora",
]


@pytest.fixture(scope="session")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("runtime")
    rc, log = torchrun(JOBS / "scenarios.py", out, *SCENARIOS, cwd=out)
    assert rc == 0, log[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def result(ranks, name):
    r0, r1 = ranks[0][name], ranks[1][name]
    # Every rank ends with the same combined report and makes the same decision.
    assert r0["findings"] == r1["findings"]
    assert r0["raised"] == r1["raised"]
    return r0, r1


def only(record, code):
    hits = [f for f in record["findings"] if f["code"] == code]
    assert len(hits) == 1, record["findings"]
    return hits[0]


@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_correct_job_has_no_findings_and_keeps_training(ranks):
    r0, r1 = result(ranks, "correct")
    assert not r0["raised"] and r0["findings"] == []
    losses = r0["extra"]["losses"]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert r1["extra"]["losses"] == losses  # FSDP: both ranks compute the same global loss


def test_check_after_an_eval_forward_is_clean(ranks):
    r0, _ = result(ranks, "after_eval_forward")
    assert not r0["raised"] and r0["findings"] == []


def test_lora_after_wrap_raises_fsdp101_on_every_rank(ranks):
    r0, r1 = result(ranks, "lora_after_wrap")
    assert r0["raised"] and r1["raised"]
    f = only(r0, "FSDP101")
    assert f["severity"] == "error" and f["name"] == "lora-after-fsdp-wrap"
    assert "8 trainable adapter params" in f["message"] and "lora_A.default.weight" in f["message"]
    assert f["notes"]["ranks"] == "all"
    assert "FSDP101" in r0["message"] and "lora_A" in r0["message"]  # rank 0 carries the full report
    assert "FSDP101" in r1["message"] and "rank 0" in r1["message"]
    # Each rank seeded its own adapter: the replicated copies already differ.
    assert "FSDP503" in r0["codes"]


def test_param_outside_every_unit_is_fsdp016(ranks):
    r0, _ = result(ranks, "forgot_root_unit")
    assert r0["raised"] and r0["codes"] == ["FSDP016"]
    assert "model.norm.weight" in only(r0, "FSDP016")["message"]


def test_trainable_ignored_param_is_fsdp001(ranks):
    r0, _ = result(ranks, "ignored_trainable")
    assert r0["raised"] and r0["codes"] == ["FSDP001"]
    assert "lm_head.weight" in only(r0, "FSDP001")["message"]


def test_optimizer_built_before_sharding_is_fsdp102(ranks):
    r0, _ = result(ranks, "stale_optimizer")
    assert r0["raised"] and r0["codes"] == ["FSDP102"]
    assert "holds 8 tensors that the model no longer has" in only(r0, "FSDP102")["message"]


def test_diverged_lora_init_across_hsdp_replicas_is_fsdp503(ranks):
    r0, _ = result(ranks, "diverged_hsdp")
    assert r0["raised"] and r0["codes"] == ["FSDP503"]
    f = only(r0, "FSDP503")
    assert f["severity"] == "error" and "lora_A" in f["message"] and "lora_B" not in f["message"]


def test_same_init_hsdp_is_clean_and_trains(ranks):
    r0, _ = result(ranks, "same_init_hsdp")
    assert not r0["raised"] and r0["findings"] == []
    assert len(r0["extra"]["losses"]) == 2


def test_diverged_init_before_wrapping_warns_without_stopping(ranks):
    r0, _ = result(ranks, "diverged_before_wrap")
    f = only(r0, "FSDP503")
    assert not r0["raised"] and f["severity"] == "warning" and "before wrapping" in f["message"]


def test_ranks_with_different_models_are_reported(ranks):
    r0, _ = result(ranks, "different_rank_configs")
    f = only(r0, "FSDP503")
    assert r0["raised"] and "ranks hold different models" in f["message"]
    assert "(8, 64)" in f["message"] and "(4, 64)" in f["message"]  # r=8 on rank 0, r=4 on rank 1


def test_mixed_trainable_dtypes_predict_the_first_forward_failure(ranks):
    r0, _ = result(ranks, "mixed_dtype")
    assert r0["raised"] and r0["codes"] == ["FSDP005"]
    assert "bfloat16, float32" in r0["findings"][0]["message"]
    # The check fired before the step; torch itself fails at the first forward.
    assert "uniform original parameter dtype" in r0["extra"]["forward_error"]


def test_4bit_weights_sharded_by_fsdp2_are_fsdp201(ranks):
    r0, _ = result(ranks, "qlora_fsdp2")
    # A warning since its CPU measurement (bench/facts/fsdp201_cpu_check.py: bitsandbytes >= 0.44 restores
    # the quant state in forward): the guard reports it and lets the job go on.
    assert not r0["raised"] and r0["codes"] == ["FSDP201"]
    f = only(r0, "FSDP201")
    assert f["severity"] == "warning" and "o_proj" in f["message"]


def test_rank_without_trainable_shard_is_info_only(ranks):
    r0, _ = result(ranks, "empty_rank_shards")
    f = only(r0, "FSDP502")
    assert not r0["raised"] and f["severity"] == "info" and "ranks 1 hold no trainable" in f["message"]


def test_adapters_synced_by_hand_are_not_flagged(ranks):
    # transformers' own pattern for adapters added to a model sharded at load time.
    r0, _ = result(ranks, "replicated_adapter_synced")
    assert not r0["raised"] and r0["findings"] == []


def test_fsdp1_on_cpu_with_peft_policy_is_clean_and_trains(ranks):
    # FullyShardedDataParallel runs on CPU with gloo and device_id=cpu: the guard checks real FSDP1 jobs.
    r0, r1 = result(ranks, "fsdp1_peft_policy")
    assert not r0["raised"] and r0["findings"] == []
    losses = r0["extra"]["losses"]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert r1["extra"]["losses"] == losses


def test_fsdp1_lora_injected_after_wrapping_is_fsdp101(ranks):
    r0, r1 = result(ranks, "fsdp1_late_lora")
    assert r0["extra"]["trainable_after_inject"] == 0  # peft itself left nothing trainable under FSDP1
    assert r0["raised"] and r1["raised"] and r0["codes"] == ["FSDP101"]
    assert "8 trainable adapter params" in only(r0, "FSDP101")["message"]


def test_findings_use_the_shared_json_schema(ranks):
    findings = [f for rank in ranks for rec in rank.values() for f in rec["findings"]]
    assert findings
    for f in findings:
        assert set(f) == FINDING_KEYS
        assert f["filename"] == "<runtime>" and f["location"] == {"row": 1, "column": 1}
        assert f["url"].endswith(f"/{f['code']}.md")


@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_uncaught_error_stops_every_rank_without_hanging(tmp_path):
    rc, log = torchrun(JOBS / "uncaught.py", "lora_after_wrap", cwd=tmp_path)
    assert rc != 0
    assert "passed the check" not in log
    assert "[rank0]: fsdplint.runtime.check.FSDPLintError" in log
    assert "[rank1]: fsdplint.runtime.check.FSDPLintError" in log
    assert "FSDP101 [error] lora-after-fsdp-wrap" in log


@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_guard_runs_in_hf_trainer_and_accelerate(tmp_path):
    rc, log = torchrun(JOBS / "hf_job.py", tmp_path, cwd=tmp_path)
    assert rc == 0, log[-4000:]
    for r in (0, 1):
        res = json.loads((tmp_path / f"hf{r}.json").read_text())
        assert res["trainer"] == {"findings": [], "steps": 2}  # the callback ran, found nothing
        assert res["accelerate"]["stale_optimizer"] == ["FSDP102"]
