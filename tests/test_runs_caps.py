"""No cut-off drops a finding without a word: with more than four opt-in flags free, a finding whose
flags are not told apart is kept, as a warning that says it needs some of them and how to decide."""

from __future__ import annotations

from fsdplint.findings import Finding, Position, Severity
from fsdplint.launch.runs import Run, add_switched, told_apart


def _finding(flags: str) -> Finding:
    f = Finding("FSDP201", "fsdp2-shards-4bit-base", Severity.ERROR, "train.py", Position(9, 1), Position(9, 10),
                "fully_shard shards the bitsandbytes 4-bit base weights.")
    f.notes["switches"] = flags
    return f


def _lint_giving(wanted: frozenset):
    """The lint of a run: the finding comes back (with its flags) only when `wanted` are all free."""
    def lint(run: Run) -> list[Finding]:
        return [_finding(" ".join(sorted(run.free)))] if wanted <= run.free else []
    return lint


def test_with_four_flags_free_the_needed_ones_are_found():
    free = frozenset({"--a", "--b", "--c", "--d"})
    kept = add_switched([], [(Run(None, free), told_apart(Run(None, free), [_finding("--a")],
                                                          _lint_giving(frozenset({"--a", "--c"}))))])
    assert [f.severity for f in kept] == [Severity.WARNING]
    assert "`--a --c`" in kept[0].message and "some of" not in kept[0].message


def test_with_more_than_four_free_an_untold_finding_is_kept_and_says_so():
    free = frozenset({"--a", "--b", "--c", "--d", "--e"})
    kept = add_switched([], [(Run(None, free), told_apart(Run(None, free), [_finding("--a")],
                                                          _lint_giving(frozenset({"--a", "--c"}))))])
    assert [f.severity for f in kept] == [Severity.WARNING]
    assert "some of `--a --b --c --d --e`" in kept[0].message
    assert "more than four opt-in flags are free" in kept[0].message and "--launch" in kept[0].message


def test_a_finding_its_claimed_flags_give_keeps_them_with_many_free():
    free = frozenset({"--a", "--b", "--c", "--d", "--e"})
    kept = add_switched([], [(Run(None, free), told_apart(Run(None, free), [_finding("--a")],
                                                          _lint_giving(frozenset({"--a"}))))])
    assert "`--a`" in kept[0].message and "some of" not in kept[0].message
