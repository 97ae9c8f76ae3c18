"""Stand-ins of `fsdplint run` for hub data the machine has not cached, and the shell launchers the
launch parser reads. No job runs here (tests/test_run_dryrun.py runs one end to end)."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("transformers")

from fsdplint.errors import UsageError  # noqa: E402
from fsdplint.run import command, standins  # noqa: E402


def _module(tmp_path, text):
    p = tmp_path / "data_prep.py"
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_columns_come_from_the_functions_the_job_maps(tmp_path):
    path = _module(tmp_path, """
        import os
        from datasets import load_dataset
        rank = int(os.environ["LOCAL_RANK"])          # not a dataset column: never mapped
        def apply_template(sample):
            return {"text": PROMPT.format(dialog=sample["dialogue"], summary=sample["summary"])}
        ds = load_dataset("org/samsum", split="train")
        ds = ds.map(apply_template, remove_columns=list(ds.features))
        raw = {"train": ds}
        raw["train"].filter(lambda row: len(row["dialogue"]) > 0)   # split names are not columns
    """)
    assert standins.columns_read_by(path) == ["dialogue", "summary"]


def test_columns_from_a_function_the_mapped_one_calls_and_the_column_calls(tmp_path):
    path = _module(tmp_path, """
        def fmt(ex):
            return {"content": join(ex)}
        def join(ex):
            return ex["instruction"] + ex["output"]
        ds = ds.map(lambda b: tok(b["sentence1"], b["sentence2"]), batched=True, remove_columns=["idx", "sentence1"])
        ds = ds.map(fmt).rename_column("label", "labels").select_columns(["input_ids", "labels"])
    """)
    cols = standins.columns_read_by(path)
    # rename_column reads "label" and makes "labels": only the one read is a column of the raw data
    assert set(cols) >= {"instruction", "output", "sentence1", "sentence2", "idx", "label"}
    assert "labels" not in cols and "input_ids" not in cols


def test_columns_a_recipe_or_the_command_line_names(tmp_path):
    recipe = tmp_path / "config_qlora.yaml"
    recipe.write_text("dataset_mixture:\n  datasets:\n    - id: org/chat\n      split: train_sft\n"
                      "      columns:\n        - messages\ndataset_text_field: text\nlearning_rate: 2.0e-4\n")
    argv = ["sft.py", "--config", str(recipe), "--dataset_text_field=content", "--lr", "1e-4"]
    assert standins.columns_configured(argv) == ["messages", "text", "content"]
    assert standins.columns_configured(["train.py", "--seed", "1"]) == []


def test_standin_dataset_has_the_columns_and_splits_asked_for():
    dd = standins.standin_dataset("org/chat", None, ["messages", "label", "prompt"])
    assert sorted(dd) == ["test", "train"]
    row = dd["train"][0]
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
    assert isinstance(row["label"], int) and isinstance(row["prompt"], str)
    one = standins.standin_dataset("org/text", "train[:5%]", [])
    assert one.column_names == ["text"] and len(one) == standins.ROWS
    assert any("dataset org/text not cached: used a 2048-row stand-in with columns text" in n for n in standins.NOTES)


def test_standin_tokenizer_takes_the_jobs_special_tokens_and_a_chat_template():
    tok = standins.standin_tokenizer("org/no-config-anywhere", pad_token="<pad>",
                                     additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    assert len(tok) == 32000  # no config cached either: a Llama-2-sized vocabulary
    assert tok.pad_token == "<pad>" and "<|im_end|>" in tok.all_special_tokens
    text = tok.apply_chat_template([{"role": "user", "content": "hello world"}], tokenize=False)
    assert "user: hello world" in text
    ids = tok(["the cat sat", "hello"], padding=True)["input_ids"]
    assert len(ids[0]) == len(ids[1]) == 3


LAUNCHER = """#!/bin/bash
# launch the job on one node
MODEL=${MODEL:-meta-llama/Llama-2-7b-hf}
accelerate launch --config_file "configs/fsdp.yaml" \\
  train.py \\
  --model_name_or_path "$MODEL" \\
  --bf16 True "$@"
"""


@pytest.fixture()
def launcher_dir(tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "fsdp.yaml").write_text("distributed_type: FSDP\nnum_processes: 4\n"
                                                    "fsdp_config:\n  fsdp_version: 2\n")
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "run.sh").write_text(LAUNCHER)
    (tmp_path / "run.sh").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("words", [["bash", "run.sh", "--max_steps", "2"], ["./run.sh", "--max_steps", "2"],
                                   ["sh", "-e", "run.sh", "--max_steps", "2"]])
def test_a_shell_launcher_runs_its_launch_with_the_files_arguments(launcher_dir, words):
    job = command.parse(words)
    assert job.kind == "path" and job.entry == str(launcher_dir / "train.py")
    assert job.args == ["--model_name_or_path", "meta-llama/Llama-2-7b-hf", "--bf16", "True", "--max_steps", "2"]
    assert job.nproc_per_node == 4 and job.env["ACCELERATE_USE_FSDP"] == "true" and job.env["FSDP_VERSION"] == "2"
    assert job.text.startswith("run.sh:4: accelerate launch") or job.text.startswith("./run.sh:4:")


def test_bash_c_and_env_prefix_reach_the_launch(launcher_dir):
    job = command.parse(["CUDA_VISIBLE_DEVICES=0,1", "bash", "-c",
                         "torchrun --nnodes 2 --nproc-per-node 2 train.py --lr 1e-4"])
    assert (job.nproc_per_node, job.nnodes, job.args) == (2, 2, ["--lr", "1e-4"])
    assert job.env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_a_shell_file_without_a_launch_is_a_one_line_error(launcher_dir):
    (launcher_dir / "setup.sh").write_text("pip install -r requirements.txt\necho done\n")
    with pytest.raises(UsageError, match=r"setup.sh: holds no python, torchrun or accelerate launch"):
        command.parse(["bash", "setup.sh"])
    with pytest.raises(UsageError, match=r"missing.sh: "):
        command.parse(["bash", "missing.sh"])


def test_a_mistyped_local_path_is_not_taken_for_a_hub_id(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)
    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    for cls in (AutoTokenizer, PreTrainedTokenizerBase):  # undone after the test: other tests load for real
        monkeypatch.setattr(cls, "from_pretrained", cls.__dict__["from_pretrained"])
    standins._tokenizers()
    (tmp_path / "models" / "llama-empty").mkdir()
    with pytest.raises((OSError, ValueError)):  # a local directory without a tokenizer: the job's own error, as on the cluster
        AutoTokenizer.from_pretrained("models/llama-empty")
    assert standins._is_local("models/llama-typo") and not standins._is_local("meta-llama/Llama-2-7b-hf")


def test_standin_metric_reports_the_keys_of_the_metric_it_stands_for():
    torch = pytest.importorskip("torch")
    mrpc = standins.standin_metric("glue", "mrpc")
    # an evaluation loop's shape: batches of tensors, then one compute()
    mrpc.add_batch(predictions=torch.tensor([1, 0, 1]), references=torch.tensor([1, 0, 0]))
    mrpc.add_batch(predictions=torch.tensor([1]), references=torch.tensor([1]))
    assert mrpc.compute() == {"accuracy": 0.75, "f1": 0.8}
    assert mrpc.compute() is None  # compute() empties it, as the real metric does
    cola = standins.standin_metric("glue", "cola")
    assert cola.compute(predictions=[1, 0, 1, 0], references=[1, 0, 1, 0]) == {"matthews_correlation": 1.0}
    stsb = standins.standin_metric("glue", "stsb").compute(predictions=[0.1, 0.4, 0.9], references=[1.0, 2.0, 3.0])
    assert set(stsb) == {"pearson", "spearmanr"} and stsb["spearmanr"] == pytest.approx(1.0)
    acc = standins.standin_metric("some-org/my_metric")
    acc.add(prediction=2, reference=2)
    acc.add(prediction=0, reference=1)
    assert acc.compute() == {"accuracy": 0.5}
    assert any(n.startswith("metric glue (mrpc) not cached: used a stand-in computing accuracy, f1")
               for n in standins.NOTES)


def test_without_evaluate_installed_nothing_is_patched_and_the_job_import_fails_as_usual(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "evaluate", None)  # `import evaluate` raises ImportError
    standins._metrics()  # must not raise: the job's own import reports the missing package
    with pytest.raises(ImportError):
        import evaluate  # noqa: F401


def test_evaluate_load_of_an_uncached_hub_metric_gets_the_standin(monkeypatch, tmp_path):
    import evaluate  # the dev extra installs it
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(evaluate, "load", evaluate.load)  # restored after the test
    standins._metrics()
    metric = evaluate.load("glue", "mrpc")
    assert isinstance(metric, standins.StandinMetric) and metric.keys == ("accuracy", "f1")
    with pytest.raises(Exception):
        evaluate.load("./metrics/missing_metric.py")  # a local path the job names is its own error


def test_a_missing_module_the_job_imports_says_what_to_install():
    from fsdplint.output.short import sentences
    from fsdplint.run.errors import JOB_RAISED
    from fsdplint.run.report import raised_message

    msg = raised_message("ModuleNotFoundError: No module named 'evaluate.loading'", JOB_RAISED)
    assert msg.startswith("the job raises `ModuleNotFoundError: No module named 'evaluate.loading'`")
    assert sentences(msg)[-1].startswith("Install `evaluate` in the environment fsdplint runs in")
    other = raised_message("RuntimeError: element 0 of tensors does not require grad", "FSDP105")
    assert other == ("the job raises `RuntimeError: element 0 of tensors does not require grad` "
                     "(see `fsdplint rule FSDP105`)")


def test_a_raised_text_that_quotes_itself_keeps_its_first_clause_whole():
    from fsdplint.output.short import _first_clause, sentences
    from fsdplint.run.report import raised_message

    text = "ValueError: Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`"
    msg = raised_message(text, "FSDP004")
    assert _first_clause(sentences(msg)[0]) == f'the job raises "{text}" (see `fsdplint rule FSDP004`)'


def test_a_dataset_loaded_whole_has_the_splits_the_job_reads(tmp_path):
    path = _module(tmp_path, """
        from datasets import load_dataset
        raw = load_dataset("org/glue", "mrpc")
        train, evaluation = raw["train"], raw["validation"]
        tok = lambda b: b["sentence1"]
    """)
    ds = standins.standin_dataset("org/glue", None, ["sentence1"], path)
    assert set(ds) == {"train", "test", "validation"}
    assert set(standins.standin_dataset("org/other", None, ["text"], None)) == {"train", "test"}
