"""`fsdplint run`: real launches of small jobs on a tiny local Llama (config + tokenizer written here,
no weights, no downloads), in a fake world of N GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[1]
JOBS = Path(__file__).resolve().parent / "run_jobs"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("run")
    model = d / "tiny"
    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, vocab_size=128, dtype="bfloat16",
                architectures=["LlamaForCausalLM"]).save_pretrained(model)
    vocab = {w: i for i, w in enumerate("[PAD] [UNK] <s> </s> the a cat dog sat on mat hello world".split())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="<s>",
                            eos_token="</s>").save_pretrained(model)
    (d / "data.jsonl").write_text('{"text": "hello world the cat"}\n{"text": "the dog sat on the mat"}\n')
    for f in JOBS.glob("*.*"):
        (d / f.name).write_text(f.read_text())
    return d


def _run(workdir, *args, fmt="json", **extra_env):
    env = {**os.environ, "MODEL": str(workdir / "tiny"), "PYTHONPATH": str(ROOT), **extra_env}
    env.pop("HF_HUB_OFFLINE", None)
    p = subprocess.run([sys.executable, "-m", "fsdplint", "run", "--output-format", fmt, *args],
                       cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    return p


def _line_of(path: Path, text: str) -> int:
    return next(i for i, l in enumerate(path.read_text().splitlines(), 1) if text in l)


def test_clean_fsdp2_lora_job_reaches_its_training_forward(workdir):
    p = _run(workdir, "--world-size", "16", "--nnodes", "2", "--", "python", "fsdp2_lora_clean.py", fmt="concise")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "simulated ranks 0, 15" in p.stdout
    assert p.stdout.count("reached the first optimizer step in") == 2
    assert "per-rank memory" in p.stdout and "All checks passed" in p.stdout
    assert "HF_HUB_OFFLINE=1" in p.stdout  # nothing downloaded, and said so


def test_qlora_fsdp1_uint8_storage_raises_fsdp202_at_the_wrap_line(workdir):
    p = _run(workdir, "--", "torchrun", "--nproc_per_node", "8", "fsdp1_qlora_uint8.py")
    assert p.returncode == 1, p.stdout + p.stderr
    found = json.loads(p.stdout)
    assert [f["code"] for f in found] == ["FSDP202"]
    f = found[0]
    assert "Cannot flatten integer dtype tensors" in f["message"] and "ranks 0, 7 of 8" in f["message"]
    assert f["filename"] == "fsdp1_qlora_uint8.py"
    assert f["location"]["row"] == _line_of(workdir / "fsdp1_qlora_uint8.py", "model = FSDP(")


def test_sft_trainer_job_reaches_its_training_forward(workdir):
    # trl's SFTTrainer builds the model from a path, adds LoRA, and Trainer wraps it with FSDP1 through
    # accelerate; its loop makes tensors on args.device and pins memory, which the fake node must take.
    pytest.importorskip("trl")
    p = _run(workdir, "--", "torchrun", "--nproc_per_node", "8", "sft_trainer.py", "tiny", fmt="concise")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("reached the first optimizer step in") == 2
    assert "All checks passed" in p.stdout


def test_accelerate_launch_with_fsdp_config_wraps_with_fsdp2(workdir):
    p = _run(workdir, "--", "accelerate", "launch", "--config_file", "accelerate_fsdp2.yaml",
             "accelerate_lora.py", "tiny", "data.jsonl", fmt="concise")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "simulated ranks 0, 7" in p.stdout  # num_processes: 8 in the YAML
    assert p.stdout.count("(optimizer, wrap, forward, step;") == 2  # accelerate's prepare did the wrap
    # fsdp_cpu_ram_efficient_loading: rank 0 broadcasts the twin's weights under the fake group, and it says so
    assert "rank 0's broadcast of the full state dict ran under the fake process group" in p.stdout


def test_missing_script_is_one_line_error(workdir):
    p = _run(workdir, "--", "python", "no_such_train.py", fmt="concise")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["fsdplint: error: fsdplint run: no_such_train.py: No such file"]


def test_script_alone_runs_the_launch_the_static_side_found(workdir):
    proj = workdir / "proj"
    proj.mkdir(exist_ok=True)
    (proj / "pyproject.toml").write_text("")
    (proj / "train.py").write_text((workdir / "fsdp2_lora_after_wrap.py").read_text())
    (proj / "launch.sh").write_text('#!/bin/bash\ntorchrun --nproc_per_node 2 \\\n  train.py "$@"\n')
    env = {**os.environ, "MODEL": str(workdir / "tiny"), "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "fsdplint", "run", str(proj / "train.py")], cwd=workdir, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "fsdplint run: torchrun --nproc_per_node 2 train.py" in p.stdout  # the launch from launch.sh
    assert "simulated ranks 0, 1" in p.stdout
    # LoRA injected after fully_shard: found on the live model after its real forward and backward,
    # reported where the job stopped, its first optimizer step
    assert f"train.py:{_line_of(proj / 'train.py', 'opt.step()')}:1: FSDP101" in p.stdout, p.stdout


def test_backward_error_of_reentrant_checkpointing_is_fsdp105_at_the_backward_line(workdir):
    # The job's forward and backward run for real on the shrunk twin: torch's reentrant checkpoint
    # over a frozen base leaves the loss without a grad_fn, and backward() raises what the cluster
    # would raise, at the user's line.
    p = _run(workdir, "--", "torchrun", "--nproc_per_node", "4", "fsdp2_reentrant_frozen.py")
    assert p.returncode == 1, p.stdout + p.stderr
    found = json.loads(p.stdout)
    assert [f["code"] for f in found] == ["FSDP105"], found
    assert "element 0 of tensors does not require grad" in found[0]["message"]
    assert "ranks 0, 3 of 4" in found[0]["message"]
    assert found[0]["location"]["row"] == _line_of(workdir / "fsdp2_reentrant_frozen.py", "loss.backward()")


def test_qlora_fsdp2_through_the_trainer_reports_the_4bit_base_as_the_live_model_shows_it(workdir):
    # SFTTrainer + accelerate's FSDP2 prepare on a real 4-bit (bf16 storage) twin: the run trains to its
    # first step and reports, as a warning, how FSDP2 holds the 4-bit base; the memory table is the
    # real config's and includes the 4-bit weights.
    pytest.importorskip("trl")
    p = _run(workdir, "--", "accelerate", "launch", "--config_file", "accelerate_fsdp2.yaml", "sft_trainer.py",
             "tiny", "bfloat16", fmt="concise")
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.count("reached the first optimizer step in") == 2, p.stdout
    assert "FSDP201 [warning]" in p.stdout and "4-bit weight" in p.stdout
    assert "4-bit quant_state" in p.stdout  # the real config's memory lines
    assert f"sft_trainer.py:{_line_of(workdir / 'sft_trainer.py', 'trainer.train()')}:1: FSDP201" in p.stdout


def test_a_job_measuring_its_gpu_memory_reaches_the_step(workdir):
    # torch.cuda's peak gauges and stats (reset_max_memory_allocated calls reset_peak_memory_stats through
    # torch.cuda.memory's own names) answer as on a GPU the job has used nothing of.
    p = _run(workdir, "--", "torchrun", "--nproc_per_node", "2", "fsdp2_memory_tracking.py", fmt="concise")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("reached the first optimizer step in") == 2, p.stdout


def test_uncached_hub_tokenizer_and_dataset_get_stand_ins_and_the_report_says_so(workdir):
    # Only the model's config.json is in this hub cache (as after `hf download ID config.json`); the job
    # also asks the hub for its tokenizer, a prompt-completion dataset and flash-attention.
    import shutil

    snap = workdir / "hub" / "models--fsdplint-test--tiny-chat" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True, exist_ok=True)
    shutil.copy(workdir / "tiny" / "config.json", snap / "config.json")
    (snap.parents[1] / "refs").mkdir(exist_ok=True)
    (snap.parents[1] / "refs" / "main").write_text("0" * 40)
    p = _run(workdir, "--", "torchrun", "--nproc_per_node", "2", "hub_data_standins.py", fmt="concise",
             HF_HUB_CACHE=str(workdir / "hub"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("reached the first optimizer step in") == 2, p.stdout
    assert ("tokenizer fsdplint-test/tiny-chat not cached: used a stand-in word-level tokenizer of its config's "
            "vocabulary of 128") in p.stdout
    assert ("dataset fsdplint-test/prompt-completion not cached: used a 2048-row stand-in with columns prompt, "
            "completion (read from hub_data_standins.py)") in p.stdout
    # flash-attention: the twin computes attention with sdpa on the CPU, and the report says so
    assert "flash_attention" in p.stdout and "sdpa" in p.stdout, p.stdout


def test_fsdp1_orig_params_ranks_without_elements_of_an_adapter_are_not_missing_its_gradient(workdir):
    # FSDP1 with use_orig_params=True: on each rank, the adapters none of whose elements are in its shard
    # are empty views whose gradient stays None by design; the step check must not call them untrained.
    # The same job with a loss that skips the second layer still has its untrained adapters named.
    job = workdir / "fsdp1_orig_params_mixed_unit.py"
    p = _run(workdir, "--", "torchrun", "--nproc_per_node", "8", job.name)
    assert p.returncode == 0, p.stdout + p.stderr
    found = json.loads(p.stdout)
    assert [f for f in found if f["severity"] != "info"] == [], found
    p = _run(workdir, "--", "torchrun", "--nproc_per_node", "8", job.name, "--detach-second-layer")
    found = json.loads(p.stdout)
    no_grad = [f for f in found if f["code"] == "FSDP504"]
    assert no_grad and all("layers.1." in f["message"] and "layers.0." not in f["message"] for f in no_grad), found


# Jobs under CUDA autocast (mixed precision): the dry run applies CUDA autocast's casts to the twin's CPU
# tensors, so forward and backward run with a GPU run's dtypes and reach the step, with no dtype error a
# GPU would not raise.
AUTOCAST_NOTE = "the CPU applied CUDA autocast's op policy"


def _reached_step_clean(p, dtype="bfloat16"):
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("reached the first optimizer step in") == 2, p.stdout
    assert f"the job runs under CUDA autocast ({dtype})" in p.stdout and AUTOCAST_NOTE in p.stdout, p.stdout
    assert "same dtype" not in p.stdout and "[error]" not in p.stdout and "[warning]" not in p.stdout, p.stdout


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_custom_loop_under_cuda_autocast_reaches_the_step(workdir, precision):
    # bf16: `with torch.autocast("cuda", dtype=torch.bfloat16)`; fp16: torch.amp.autocast + GradScaler. The
    # bf16/fp16 base and peft's float32 adapters meet in each LoRA linear, as on a GPU only through autocast.
    p = _run(workdir, "--", "torchrun", "--nproc_per_node", "4", "autocast_loop.py", precision, fmt="concise")
    _reached_step_clean(p, {"bf16": "bfloat16", "fp16": "float16"}[precision])


def test_accelerate_bf16_fsdp1_lora_job_reaches_the_step(workdir):
    # accelerate's mixed_precision: bf16 with FSDP1 autocasts the prepared model's forward on "cuda".
    p = _run(workdir, "--", "accelerate", "launch", "--config_file", "accelerate_fsdp1_bf16.yaml",
             "accelerate_lora.py", "tiny", "data.jsonl", "float32", fmt="concise")
    _reached_step_clean(p)


def test_trainer_bf16_qlora_with_gradient_checkpointing_reaches_the_step(workdir):
    # SFTTrainer(bf16=True) under accelerate's FSDP1 config, a 4-bit (bf16 storage) twin and gradient
    # checkpointing: the recomputation in backward re-enters CUDA autocast and gets the forward's dtypes.
    pytest.importorskip("trl")
    p = _run(workdir, "--", "accelerate", "launch", "--config_file", "accelerate_fsdp1_bf16.yaml", "sft_trainer.py",
             "tiny", "bfloat16", "--gradient_checkpointing", fmt="concise")
    _reached_step_clean(p)
    assert "checkpointing" in p.stdout  # the memory table of the real config counts it


def test_trainer_lora_dropout_non_reentrant_checkpointing_under_fsdp1_bf16_reaches_the_step(workdir):
    # peft's examples/sft settings: float32 model, LoRA with dropout, `use_reentrant: False`, FSDP1 with
    # `mixed_precision: bf16` and flat parameters. The recomputation's LoRA inputs are bfloat16 where the
    # forward's were float32 (the adapters' weight dtype before and after the unit's first unshard); a
    # GPU's fused dropout saves a bool mask either way, so torch.utils.checkpoint accepts it there.
    pytest.importorskip("trl")
    p = _run(workdir, "--", "accelerate", "launch", "--config_file", "accelerate_fsdp1_bf16_flat.yaml",
             "trainer_lora_dropout_checkpointing.py", "tiny", fmt="concise")
    _reached_step_clean(p)
    assert "recomputation did not get its forward's dtypes" not in p.stdout, p.stdout


def test_backward_error_under_cuda_autocast_is_fsdp105_at_the_backward_line(workdir):
    p = _run(workdir, "--", "torchrun", "--nproc_per_node", "4", "autocast_reentrant_frozen.py")
    assert p.returncode == 1, p.stdout + p.stderr
    found = json.loads(p.stdout)
    assert [f["code"] for f in found] == ["FSDP105"], found
    assert "element 0 of tensors does not require grad" in found[0]["message"]
    assert found[0]["location"]["row"] == _line_of(workdir / "autocast_reentrant_frozen.py", "loss.backward()")
    assert AUTOCAST_NOTE in p.stderr  # the summary beside the JSON report: the forward ran under autocast
