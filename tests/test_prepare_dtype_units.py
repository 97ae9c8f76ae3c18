"""FSDP005 for jobs that `accelerator.prepare` wraps with FSDP1 from a launch config: the static side reports
what the model audit (`--model`) reports on the same job, in the shapes users write (module-level script, a
`main()` with a helper in another module, a launcher script naming the config), and stays silent where
peft's policy, a cast or unupcast adapters keep one dtype per unit."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from fsdplint.cli import main

FSDP1 = """
    distributed_type: FSDP
    mixed_precision: bf16
    num_processes: 2
    fsdp_config:
      fsdp_version: 1
      fsdp_auto_wrap_policy: {policy}
      fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
      fsdp_use_orig_params: true
"""
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
              "vocab_size": 128, "max_position_embeddings": 64, "torch_dtype": "bfloat16"}
LOAD = 'AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)'
LORA = 'LoraConfig(r=8, target_modules=["q_proj", "v_proj"])'
IMPORTS = """
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
"""

SHAPES = {
    "module level": {
        "train.py": IMPORTS + f"""
    accelerator = Accelerator()
    model = get_peft_model({LOAD}, {LORA})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
""",
    },
    "helper in another module, main()": {
        "modeling.py": IMPORTS + f"""
    def build():
        model = {LOAD}
        return get_peft_model(model, {LORA})
""",
        "train.py": IMPORTS + """
    from modeling import build

    def main():
        accelerator = Accelerator()
        model = build()
        model = accelerator.prepare(model)

    if __name__ == "__main__":
        main()
""",
    },
    "prepared under another name": {
        "train.py": IMPORTS + f"""
    def main():
        acc = Accelerator()
        base = {LOAD}
        peft_model = get_peft_model(base, {LORA})
        net, = acc.prepare(peft_model)

    main()
""",
    },
}


def _project(tmp_path: Path, files: dict, policy: str = "TRANSFORMER_BASED_WRAP") -> Path:
    root = tmp_path / "job"
    (root / ".git").mkdir(parents=True)
    (root / "configs").mkdir()
    (root / "configs" / "fsdp.yaml").write_text(textwrap.dedent(FSDP1.format(policy=policy)))
    # The config is named only by the launcher, in another folder than the script.
    (root / "run.sh").write_text("accelerate launch --config_file configs/fsdp.yaml train.py\n")
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    (root / "config.json").write_text(json.dumps(TINY_LLAMA))
    return root


def _codes(root: Path, *extra: str) -> list[tuple]:
    r = CliRunner().invoke(main, ["check", "--isolated", "--exit-zero", "--no-cache", "--select", "FSDP005,FSDP900",
                                  "--output-format", "json", *extra, str(root / "train.py")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return sorted({(f["code"], f["severity"]) for f in json.loads(r.stdout)})


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_static_reports_the_mixed_unit_of_a_prepared_lora_model(tmp_path, shape):
    root = _project(tmp_path, SHAPES[shape])
    assert _codes(root) == [("FSDP005", "error")]


@pytest.mark.parametrize("policy", ["NO_WRAP", "SIZE_BASED_WRAP"])
def test_other_mixing_policies_are_reported(tmp_path, policy):
    root = _project(tmp_path, SHAPES["module level"], policy)
    assert _codes(root) == [("FSDP005", "error")]


def test_static_and_audit_agree(tmp_path):
    root = _project(tmp_path, SHAPES["module level"])
    static = _codes(root)
    audited = _codes(root, "--model", str(root / "config.json"))
    assert static == audited == [("FSDP005", "error")]


FIXES = {
    "peft's policy on the plugin": ("model, optimizer = accelerator.prepare(model, optimizer)",
                                    "from peft.utils.other import fsdp_auto_wrap_policy\n"
                                    "accelerator.state.fsdp_plugin.auto_wrap_policy = fsdp_auto_wrap_policy(model)\n"
                                    "model, optimizer = accelerator.prepare(model, optimizer)"),
    "adapters kept in bf16": (f"get_peft_model({LOAD}, {LORA})",
                              f"get_peft_model({LOAD}, {LORA}, autocast_adapter_dtype=False)"),
    "cast before prepare": ("model, optimizer = accelerator.prepare(model, optimizer)",
                            "model.to(torch.bfloat16)\nmodel, optimizer = accelerator.prepare(model, optimizer)"),
}


@pytest.mark.parametrize("fix", sorted(FIXES))
def test_one_dtype_per_unit_is_not_reported(tmp_path, fix):
    old, new = FIXES[fix]
    text = textwrap.dedent(SHAPES["module level"]["train.py"])
    assert old in text
    root = _project(tmp_path, {"train.py": text.replace(old, new)})
    assert _codes(root) == []


def test_fsdp2_config_is_not_this_path(tmp_path):
    root = _project(tmp_path, SHAPES["module level"])
    cfg = root / "configs" / "fsdp.yaml"
    cfg.write_text(cfg.read_text().replace("fsdp_version: 1", "fsdp_version: 2"))
    assert _codes(root, "--target-version", "torch=2.9") == []
