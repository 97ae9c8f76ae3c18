"""`concise` prints one line per finding (what breaks, the fix in a few words); `full` keeps the text."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main
from fsdplint.output.short import short_message

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "scripts"


@pytest.mark.parametrize("message, fix, want", [
    # what: why. fix.
    ("LoRA is injected after the model was wrapped with fully_shard (line 35): the adapter params are not sharded. "
     "Inject LoRA first, then wrap.", None,
     "LoRA is injected after the model was wrapped with fully_shard (line 35). Inject LoRA first, then wrap."),
    # A call's own parentheses stay; an aside ending a clause goes.
    ("fully_shard shards the 4-bit base: quant_state is lost. Pass them as fully_shard(..., ignored_params=...) "
     "(the base weights are then replicated), or use FSDP1.", None,
     "fully_shard shards the 4-bit base. Pass them as fully_shard(..., ignored_params=...), or use FSDP1."),
    # A fix's title wins over the message's last sentence; a question keeps its mark.
    ("The root reshards after forward: an extra all-gather. Drop the argument (the default keeps it).", "Drop reshard_after_forward=True",
     "The root reshards after forward. Drop reshard_after_forward=True."),
    ("LoRA target 'vproj' matches no module. Did you mean v_proj?", None, "LoRA target 'vproj' matches no module. Did you mean v_proj?"),
    # A colon inside backticks or quotes is not a clause end.
    ("`a: b` is set: it breaks. Unset it.", None, "`a: b` is set. Unset it."),
    # When the finding holds (a branch, a launch's flags) stays.
    ("Saved on rank 0 only: it hangs. Save on all ranks. (when launched with run.sh:1 with `--use_fsdp`)", None,
     "Saved on rank 0 only. Save on all ranks. (when launched with run.sh:1 with `--use_fsdp`)"),
    # One sentence: kept as its first clause.
    ("The mesh is (shard, replicate): FSDP reads dim 0 as replicate", None, "The mesh is (shard, replicate)."),
])
def test_short_message(message, fix, want):
    assert short_message(message, fix) == want


def test_concise_is_one_short_line_per_finding_and_full_keeps_the_text(tmp_path):
    script = FIXTURES / "fsdp2_lora_after_shard_buggy.py"
    concise = CliRunner().invoke(main, ["--isolated", "--no-cache", str(script)])
    full = CliRunner().invoke(main, ["--isolated", "--no-cache", str(script), "--output-format", "full"])
    assert concise.exit_code == full.exit_code == 1
    lines = [ln for ln in concise.output.splitlines() if "FSDP" in ln]
    assert [ln.split()[1] for ln in lines] == ["FSDP101", "FSDP401"]
    full_heads = [ln for ln in full.output.splitlines() if " FSDP" in ln and ln.startswith(str(script))]
    for short, long in zip(lines, full_heads):
        assert len(short) < 0.7 * len(long), short
    assert "Inject LoRA first, then wrap." in lines[0] and "never reduced" not in lines[0]
    assert "never reduced" in full.output and "Inject LoRA first, then wrap." in full.output
