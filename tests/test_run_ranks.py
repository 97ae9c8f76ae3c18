"""`fsdplint run` where ranks differ at load time: rank-0-only loading by the job's own rank guard,
transformers' cpu-RAM-efficient loading (env or accelerate config), and what fills the other ranks'
shards (sync_module_states, a broadcast from rank 0). Real launches of small jobs on a tiny local
Llama (config, tokenizer and a safetensors index written here; no weights, no downloads)."""

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
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("ranks")
    model = d / "tiny"
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=128, dtype="bfloat16", architectures=["LlamaForCausalLM"])
    config.save_pretrained(model)
    # The causal-LM checkpoint's tensor names (its index; the weights themselves are never read).
    with torch.device("meta"):
        names = list(LlamaForCausalLM(config).state_dict())
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "model-00001-of-00001.safetensors" for k in names}}))
    vocab = {w: i for i, w in enumerate("[PAD] [UNK] <s> </s> the a cat dog sat on mat hello world".split())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="<s>",
                            eos_token="</s>").save_pretrained(model)
    for f in JOBS.glob("*.*"):
        (d / f.name).write_text(f.read_text())
    return d


def _run(workdir, *args, **extra_env):
    env = {**os.environ, "MODEL": str(workdir / "tiny"), "PYTHONPATH": str(ROOT), **extra_env}
    for k in ("HF_HUB_OFFLINE", "ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING"):
        if k not in extra_env:
            env.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "fsdplint", "run", "--output-format", "json", *args],
                       cwd=workdir, env=env, capture_output=True, text=True, timeout=400)
    try:
        return p, json.loads(p.stdout)
    except ValueError:
        raise AssertionError(p.stdout + p.stderr) from None


def _line_of(path: Path, text: str) -> int:
    return next(i for i, l in enumerate(path.read_text().splitlines(), 1) if text in l)


@pytest.mark.parametrize("sync", [False, True])
def test_fsdp1_rank0_only_load_needs_sync_module_states(workdir, sync):
    # Rank 0 loads, the others build on meta and FSDP materializes them with to_empty(): without
    # sync_module_states the last rank trains uninitialized memory; with it, rank 0's weights arrive.
    p, found = _run(workdir, "--", "torchrun", "--nproc_per_node", "4", "fsdp1_rank0_load.py",
                    *(["--sync"] if sync else []))
    if sync:
        assert p.returncode == 0 and found == [], found
        return
    assert p.returncode == 1, p.stdout + p.stderr
    assert [f["code"] for f in found] == ["FSDP011"], found
    f = found[0]
    assert "rank 3 wraps a model whose weights it did not load" in f["message"]
    assert "uninitialized memory" in f["message"] and "[rank 3 of 4]" in f["message"]
    assert f["filename"] == "fsdp1_rank0_load.py"
    assert f["location"]["row"] == _line_of(workdir / "fsdp1_rank0_load.py", "model = FSDP(")


def test_cpu_ram_efficient_loading_env_leaves_the_new_head_empty_on_other_ranks(workdir):
    # FSDP_CPU_RAM_EFFICIENT_LOADING: transformers' own loader, on a non-zero local rank, leaves the
    # keys the checkpoint lacks (the classification head) on meta; FSDP without sync_module_states
    # then fills them with to_empty's uninitialized memory on that rank only.
    p, found = _run(workdir, "--", "torchrun", "--nproc_per_node", "2", "fsdp1_seq_cls.py",
                    ACCELERATE_USE_FSDP="true", FSDP_CPU_RAM_EFFICIENT_LOADING="true")
    assert p.returncode == 1, p.stdout + p.stderr
    assert [f["code"] for f in found] == ["FSDP011"], found
    assert "score" in found[0]["message"] and "[rank 1 of 2]" in found[0]["message"]
    assert found[0]["location"]["row"] == _line_of(workdir / "fsdp1_seq_cls.py", "model = FSDP(")


@pytest.mark.parametrize("sync", [False, True])
def test_cpu_ram_efficient_loading_from_an_accelerate_config(workdir, sync):
    # The same job launched by accelerate with fsdp_cpu_ram_efficient_loading in its YAML: the launcher's
    # environment makes the real loader decide per rank, as on the cluster.
    p, found = _run(workdir, "--", "accelerate", "launch", "--config_file", "accelerate_fsdp1_efficient.yaml",
                    "fsdp1_seq_cls.py", *(["--sync"] if sync else []))
    if sync:
        assert p.returncode == 0 and found == [], found
        return
    assert [f["code"] for f in found] == ["FSDP011"], found
    assert "[rank 3 of 4]" in found[0]["message"]


@pytest.mark.parametrize("broadcast", [False, True])
def test_fsdp2_meta_ranks_are_filled_only_by_a_broadcast_from_rank_0(workdir, broadcast):
    # FSDP2 has no sync_module_states: the other ranks' to_empty() shards hold garbage unless
    # set_model_state_dict(broadcast_from_rank0=True) fills them; its object broadcast reaches the
    # last rank from rank 0, and the run follows the real keys.
    p, found = _run(workdir, "--", "torchrun", "--nproc_per_node", "2", "fsdp2_rank0_broadcast.py",
                    *(["--broadcast"] if broadcast else []))
    if broadcast:
        assert p.returncode == 0 and found == [], found
        return
    assert [f["code"] for f in found] == ["FSDP011"], found
    assert "nothing filled after fully_shard" in found[0]["message"] and "[rank 1 of 2]" in found[0]["message"]
    assert found[0]["location"]["row"] == _line_of(workdir / "fsdp2_rank0_broadcast.py", "fully_shard(model)")


def test_a_barrier_only_rank_0_enters_is_a_hang_at_its_line(workdir, tmp_path):
    # The collectives each simulated rank enters are logged and compared once both reached their step.
    p, found = _run(workdir, "--", "torchrun", "--nproc_per_node", "2", "fsdp2_barrier_on_rank0.py",
                    OUT=str(tmp_path))
    assert [f["code"] for f in found] == ["FSDP401"], found
    assert "rank 0 enters 1 more barrier() than rank 1" in found[0]["message"]
    assert found[0]["location"]["row"] == _line_of(workdir / "fsdp2_barrier_on_rank0.py", "dist.barrier()")


@pytest.mark.parametrize("every_rank", [False, True])
def test_a_full_tensor_only_rank_0_calls_is_a_hang_at_its_line(workdir, every_rank):
    # DTensor's full_tensor() all-gathers through torch's functional collectives, not c10d's Python API:
    # rank 0 alone gathering an FSDP2 parameter waits for ranks that never enter that all-gather.
    extra = {"EVERY_RANK": "1"} if every_rank else {}
    p, found = _run(workdir, "--", "torchrun", "--nproc_per_node", "2", "fsdp2_full_tensor_on_rank0.py", **extra)
    if every_rank:
        assert p.returncode == 0 and found == [], found
        return
    assert [f["code"] for f in found] == ["FSDP401"], found
    assert "rank 0 enters 1 more _c10d_functional.all_gather_into_tensor() than rank 1" in found[0]["message"]
    assert found[0]["location"]["row"] == _line_of(workdir / "fsdp2_full_tensor_on_rank0.py", "embed.full_tensor()")


def test_trainer_under_cpu_ram_efficient_fsdp1_runs_clean_on_every_rank(workdir):
    # SFTTrainer + accelerate's FSDP1 prepare with fsdp_cpu_ram_efficient_loading: the non-zero rank's model
    # comes from transformers' own loader and keeps the path the job named (trl reads it back).
    pytest.importorskip("trl")
    (workdir / "data.jsonl").write_text('{"text": "hello world the cat"}\n{"text": "the dog sat on the mat"}\n')
    p, found = _run(workdir, "--world-size", "2", "--", "accelerate", "launch", "--config_file",
                    "accelerate_fsdp1_efficient.yaml", "sft_trainer.py", "tiny")
    assert p.returncode == 0 and found == [], found


def test_packed_4bit_weights_are_not_judged_for_the_marker():
    """bitsandbytes loads its quantized weights itself: the step check leaves its packed Params4bit alone
    (comparing one runs the library's own dispatch on packed storage) and still judges plain tensors."""
    import torch
    import bitsandbytes as bnb

    from fsdplint.run import ranks

    layer = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.bfloat16, quant_storage=torch.bfloat16)
    layer = layer.to("cpu")  # quantizes (bitsandbytes runs 4-bit on the CPU)
    layer.weight = bnb.nn.Params4bit(torch.randn(64, 64), requires_grad=False,
                                     quant_storage=torch.bfloat16)._quantize("cpu")
    assert ranks.holds_marker(layer.weight) is False
    assert ranks.holds_marker(torch.full((4, 4), ranks.FLOAT_MARKER)) is True
    assert ranks.holds_marker(torch.ones(4, 4)) is False
