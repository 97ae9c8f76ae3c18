"""fsdplint.check in one process, without a process group: API, selection, reporting."""

import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("transformers")

import fsdplint  # noqa: E402
from fsdplint.runtime import FSDPLintWarning  # noqa: E402
from fsdplint.runtime.consistency import ranges  # noqa: E402


@pytest.fixture(scope="module")
def lora_model():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )
    return get_peft_model(LlamaForCausalLM(config), LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))


def good_optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])


def stale_optimizer():
    # Tensors the model does not have: what an optimizer built before wrapping holds.
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(8, 64)), torch.nn.Parameter(torch.zeros(64, 8))])


def test_lazy_exports():
    from fsdplint.runtime.check import FSDPLintError, check

    assert fsdplint.check is check and fsdplint.FSDPLintError is FSDPLintError


def test_correct_model_and_optimizer_are_silent(lora_model, capsys):
    assert fsdplint.check(lora_model, good_optimizer(lora_model)) == []
    assert capsys.readouterr().err == ""


def test_unwrapped_model_outside_a_job_is_not_flagged(lora_model):
    # Nothing is wrapped and there is one process: no unit could be missing.
    assert fsdplint.check(lora_model) == []


def test_stale_optimizer_raises_with_the_report(lora_model):
    with pytest.raises(fsdplint.FSDPLintError) as info:
        fsdplint.check(lora_model, stale_optimizer())
    [finding] = info.value.findings
    assert finding.code == "FSDP102" and finding.severity.value == "error"
    assert "<runtime>:1:1: FSDP102 [error] optimizer-before-wrap" in str(info.value)
    assert "8 trainable model params" in finding.message and "will never be updated" in finding.message


def test_warn_mode_warns_and_returns(lora_model):
    with pytest.warns(FSDPLintWarning, match="FSDP102"):
        found = fsdplint.check(lora_model, stale_optimizer(), on_error="warn")
    assert [f.code for f in found] == ["FSDP102"]


def test_log_mode_logs_an_error(lora_model, caplog):
    with caplog.at_level(logging.WARNING, logger="fsdplint.runtime"):
        found = fsdplint.check(lora_model, stale_optimizer(), on_error="log")
    assert [f.code for f in found] == ["FSDP102"]
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert "FSDP102" in caplog.records[0].getMessage()


@pytest.mark.parametrize(
    "select, ignore, expected",
    [
        (None, None, ["FSDP102"]),
        (["FSDP1"], None, ["FSDP102"]),
        (["optimizer-before-wrap"], None, ["FSDP102"]),
        ("FSDP102", None, ["FSDP102"]),
        (["FSDP0"], None, []),
        (None, ["FSDP102"], []),
        (["ALL"], ["FSDP10"], []),
    ],
)
def test_select_and_ignore(lora_model, select, ignore, expected):
    found = fsdplint.check(lora_model, stale_optimizer(), on_error="log", select=select, ignore=ignore)
    assert [f.code for f in found] == expected


def test_bad_arguments_fail_with_one_clear_line(lora_model):
    with pytest.raises(ValueError, match=r"unknown rule selector 'FSDP999' in select="):
        fsdplint.check(lora_model, select=["FSDP999"])
    with pytest.raises(ValueError, match="on_error must be one of raise, warn, log"):
        fsdplint.check(lora_model, on_error="explode")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        fsdplint.check(object())
    with pytest.raises(TypeError, match="has no param_groups"):
        fsdplint.check(lora_model, optimizer=object())


class UninspectableModel(torch.nn.Module):
    """A user model whose module walk fails (e.g. a broken custom container)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def named_modules(self, *args, **kwargs):
        raise RuntimeError("custom container cannot be walked")


def test_internal_failure_never_stops_the_job(caplog):
    with caplog.at_level(logging.WARNING, logger="fsdplint.runtime"):
        assert fsdplint.check(UninspectableModel()) == []
    assert "could not inspect the model on rank 0" in caplog.text
    assert "custom container cannot be walked" in caplog.text


def test_trainer_callback_is_a_trainer_callback():
    from transformers import TrainerCallback

    assert issubclass(fsdplint.guard.FSDPLintCallback, TrainerCallback)


def test_callback_checks_what_trainer_passes(lora_model):
    callback = fsdplint.guard.FSDPLintCallback(on_error="log")
    callback.on_train_begin(None, None, None, model=lora_model, optimizer=stale_optimizer())
    assert [f.code for f in callback.findings] == ["FSDP102"]


@pytest.mark.parametrize("ranks, text", [([0], "0"), ([0, 1, 2, 5], "0-2,5"), ([3, 1], "1,3")])
def test_rank_ranges(ranks, text):
    assert ranges(ranks) == text
