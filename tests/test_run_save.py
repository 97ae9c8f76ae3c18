"""`fsdplint run --until save`: the job runs past its first optimizer step to its first save, whose
writes go to the run's own directory, and what each simulated rank saved is judged. Real launches of
small jobs on a tiny local Llama (config and tokenizer written here; no weights, no downloads), 2 ranks."""

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

    d = tmp_path_factory.mktemp("save")
    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, vocab_size=128, dtype="bfloat16",
                architectures=["LlamaForCausalLM"]).save_pretrained(d / "tiny")
    vocab = {w: i for i, w in enumerate("[PAD] [UNK] <s> </s> the a cat dog sat on mat hello world".split())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="<s>",
                            eos_token="</s>").save_pretrained(d / "tiny")
    (d / "data.jsonl").write_text('{"text": "hello world the cat"}\n{"text": "the dog sat on the mat"}\n')
    for f in ("fsdp1_save_adapter.py", "trainer_save_steps.py"):
        (d / f).write_text((JOBS / f).read_text())
    return d


def _run(workdir, *args):
    env = {**os.environ, "MODEL": str(workdir / "tiny"), "PYTHONPATH": str(ROOT)}
    for k in ("HF_HUB_OFFLINE", "ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-m", "fsdplint", "run", "--output-format", "json", *args],
                       cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    try:
        return p, json.loads(p.stdout)
    except ValueError:
        raise AssertionError(p.stdout + p.stderr) from None


def _line_of(path: Path, text: str) -> int:
    return next(i for i, l in enumerate(path.read_text().splitlines(), 1) if text in l)


@pytest.mark.parametrize("save", ["sharded", "full", "lora-file"])
def test_fsdp1_adapter_saved_without_its_weights(workdir, save):
    # The job's loop ends with the data loader cut after its first step; its save at the end runs for real.
    # save_pretrained straight from the FSDP1 model takes the adapter from the flat shards (peft finds no
    # LoRA weight in them). Given a FULL_STATE_DICT, peft still selects the adapter's keys by its module
    # names, which carry the nested units' `_fsdp_wrapped_module.`: nothing matches. The gathered state
    # dict's LoRA entries written with safetensors by rank 0 are the whole adapter.
    p, found = _run(workdir, "--until", "save", "--", "torchrun", "--nproc_per_node", "2",
                    "fsdp1_save_adapter.py", "--save", save)
    written = [f for f in (workdir / "adapter_out").rglob("*") if f.is_file()] if (workdir / "adapter_out").exists() else []
    assert written == [], f"the job's save went where it asked: {written}"
    if save == "lora-file":
        assert p.returncode == 0 and found == [], found
        assert "rank 0: reached its first save after the first optimizer step" in p.stderr, p.stderr
        return
    assert p.returncode == 1, p.stdout + p.stderr
    assert [f["code"] for f in found] == ["FSDP402"], found
    f = found[0]
    assert "adapter_model.safetensors) holding no tensor" in f["message"], f["message"]
    assert f["filename"] == "fsdp1_save_adapter.py"
    if save == "sharded":  # every rank calls it
        assert "[ranks 0, 1 of 2]" in f["message"] and "taken from the sharded model" in f["message"]
        assert f["location"]["row"] == _line_of(workdir / "fsdp1_save_adapter.py", "model.save_pretrained(args.out)")
    else:
        assert "[rank 0 of 2]" in f["message"] and "`_fsdp_wrapped_module.`" in f["message"], f["message"]
        assert f["location"]["row"] == _line_of(workdir / "fsdp1_save_adapter.py", "state_dict=state)")


def test_a_full_state_dict_gathered_on_rank_0_only_is_a_hang(workdir):
    # Rank 0 alone enters the gather under its rank test and saves; rank 1 runs to the job's end without it.
    p, found = _run(workdir, "--until", "save", "--", "torchrun", "--nproc_per_node", "2",
                    "fsdp1_save_adapter.py", "--save", "rank0")
    assert [f["code"] for f in found] == ["FSDP401"], found
    f = found[0]
    assert "rank 0 enters" in f["message"] and "before its first save, where rank 1 ran to the job's end" in f["message"]
    assert f["location"]["row"] == _line_of(workdir / "fsdp1_save_adapter.py", "full = model.state_dict()")
    assert not [f for f in (workdir / "adapter_out").rglob("*") if f.is_file()]


def test_trainer_checkpoint_every_step_saves_cleanly_under_fsdp(workdir):
    # SFTTrainer under its own FSDP1 (FULL_STATE_DICT) with save_steps=1: the Trainer's checkpoint right after
    # the first step is the save point, on both ranks; the adapter rank 0 writes is whole.
    pytest.importorskip("trl")
    p, found = _run(workdir, "--until", "save", "--", "torchrun", "--nproc_per_node", "2",
                    "trainer_save_steps.py", "tiny")
    assert p.returncode == 0 and found == [], (found, p.stderr[-3000:])
    for rank in (0, 1):
        assert f"rank {rank}: reached its first save after the first optimizer step" in p.stderr, p.stderr
    assert not (workdir / "trainer_out").exists(), "the Trainer wrote to its output_dir"
