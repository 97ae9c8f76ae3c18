"""Random valid Python (hypothesmith) never crashes the linter, with or without FSDP/peft imports.

CI runs a fixed, derandomized number of examples; set FSDPLINT_FUZZ_EXAMPLES (e.g. 2000) for a long run.
"""

from __future__ import annotations

import ast
import json
import os

import hypothesmith
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings

from fsdplint.cli import main

EXAMPLES = int(os.environ.get("FSDPLINT_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
# Without a trigger word only the parse runs; with these every rule sees the random code.
PRELUDE = (
    "import torch\nfrom peft import LoraConfig, get_peft_model\n"
    "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, fully_shard\n"
)


def run(*args, input):
    r = CliRunner().invoke(main, ["--isolated", "--output-format", "json", *args], input=input)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    return r


@FUZZ
@given(hypothesmith.from_grammar())
def test_random_python_never_crashes(source):
    for text in (source, PRELUDE + source):
        r = run("-", "--stdin-filename", "gen.py", input=text)
        assert r.exit_code in (0, 1), r.output
        codes = [f["code"] for f in json.loads(r.stdout)]
        assert "FSDP901" not in codes and "FSDP900" not in codes, r.stdout


@FUZZ
@given(hypothesmith.from_grammar())
def test_fixing_random_python_gives_parseable_idempotent_output(source):
    text = PRELUDE + source
    once = CliRunner().invoke(main, ["--isolated", "--fix", "--unsafe-fixes", "--exit-zero", "-"], input=text)
    assert once.exit_code == 0, once.output
    ast.parse(once.stdout)
    twice = CliRunner().invoke(main, ["--isolated", "--fix", "--unsafe-fixes", "--exit-zero", "-"], input=once.stdout)
    assert twice.stdout == once.stdout
