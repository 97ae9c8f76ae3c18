"""Advisories of the training stack (transformers, trl, peft, bitsandbytes): each stays silent when the
setting that sets the bug off is absent, in the shapes users write, and fires when it is present."""

from __future__ import annotations

import pytest

from fsdplint.advisories import load
from fsdplint.registry import all_rules
from fsdplint.rule import Valid
from rule_harness import lint_example

RULE = next(r for r in all_rules() if r.code == "FSDP601")
BY_ID = {a.id: a for a in load()}

_QLORA = """
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from trl import DPOConfig, DPOTrainer
bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
args = DPOConfig("out", fsdp="full_shard auto_wrap", bf16=True)
"""
_FSDP2 = """
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
"""
_FSDP2_SAVE = """
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments
model = AutoModelForCausalLM.from_pretrained("m", quantization_config=BitsAndBytesConfig(load_in_4bit=True))
trainer = Trainer(model=model, args=TrainingArguments("out"), train_dataset=ds)
trainer.train()
trainer.save_model("final")
"""

CASES = [
    # (advisory, code, target, options, fires)
    ("trl-dpo-qlora-fsdp1-kbit-upcast",
     _QLORA + "DPOTrainer(model=model, args=args, train_dataset=ds, peft_config=LoraConfig(r=8))\n",
     {"trl": "0.20.0"}, {}, True),
    # A config built elsewhere and passed by name is still the trainer's own adapter preparation.
    ("trl-dpo-qlora-fsdp1-kbit-upcast",
     _QLORA + "lora = LoraConfig(r=8)\ntrainer = DPOTrainer(model, None, args=args, train_dataset=ds, peft_config=lora)\n",
     {"trl": "0.28.0"}, {}, True),
    # The user applied the adapters and passes the PeftModel: DPOTrainer runs no k-bit preparation.
    ("trl-dpo-qlora-fsdp1-kbit-upcast",
     _QLORA + "model = get_peft_model(model, LoraConfig(r=8))\nDPOTrainer(model=model, args=args, train_dataset=ds)\n",
     {"trl": "0.28.0"}, {}, False),
    ("trl-dpo-qlora-fsdp1-kbit-upcast",
     _QLORA + "DPOTrainer(model=model, args=args, train_dataset=ds, peft_config=None)\n",
     {"trl": "0.28.0"}, {}, False),
    # No FSDP in the job: k-bit preparation is what single-GPU QLoRA wants.
    ("trl-dpo-qlora-fsdp1-kbit-upcast",
     _QLORA.replace('fsdp="full_shard auto_wrap", ', "") + "DPOTrainer(model=model, args=args, train_dataset=ds, peft_config=LoraConfig(r=8))\n",
     {"trl": "0.28.0"}, {}, False),
    ("trl-dpo-ref-model-not-wrapped",
     _QLORA.replace("bnb_4bit_quant_storage=torch.bfloat16", "load_in_8bit=False").replace("load_in_4bit=True, ", "")
     + "DPOTrainer(model=model, ref_model=ref, args=args, train_dataset=ds)\n",
     {"trl": "0.15.2"}, {}, True),
    ("trl-dpo-ref-model-not-wrapped",
     "from trl import DPOConfig, DPOTrainer\nargs = DPOConfig('out', fsdp='full_shard auto_wrap', precompute_ref_log_probs=True)\n"
     "DPOTrainer(model=model, args=args, train_dataset=ds)\n",
     {"trl": "0.15.2"}, {}, False),
    ("trl-dpo-ref-model-not-wrapped",
     "from trl import DPOConfig, DPOTrainer\nargs = DPOConfig('out', fsdp='full_shard auto_wrap')\n"
     "DPOTrainer(model=model, args=args, train_dataset=ds, peft_config=lora_config)\n",
     {"trl": "0.15.2"}, {}, False),
    # FSDP2 from the accelerate config: the reference model is placed nowhere either.
    ("trl-dpo-ref-model-not-wrapped",
     "from trl import DPOConfig, DPOTrainer\nDPOTrainer(model=model, args=DPOConfig('out'), train_dataset=ds)\n",
     {"trl": "0.15.2"}, {"accelerate_config": _FSDP2}, True),
    # A reference model of its own is prepared with FSDP before the precompute runs.
    ("trl-dpo-precompute-ref-logps-unprepared-model",
     "from trl import DPOConfig, DPOTrainer\nargs = DPOConfig('out', fsdp='full_shard auto_wrap', precompute_ref_log_probs=True)\n"
     "DPOTrainer(model, ref_model, args=args, train_dataset=ds)\n",
     {"trl": "1.9.0"}, {}, False),
    ("trl-dpo-precompute-ref-logps-unprepared-model",
     "from trl import DPOConfig, DPOTrainer\nargs = DPOConfig('out', fsdp='full_shard auto_wrap', precompute_ref_log_probs=True)\n"
     "DPOTrainer(model, None, args=args, train_dataset=ds)\n",
     {"trl": "1.9.0"}, {}, True),
    ("trl-dpo-precompute-ref-logps-unprepared-model",
     "from trl import DPOConfig, DPOTrainer\nargs = DPOConfig('out', precompute_ref_log_probs=True)\n"
     "DPOTrainer(model, args=args, train_dataset=ds)\n",
     {"trl": "1.9.0"}, {}, False),
    ("trl-grpo-fsdp1-generate-sharded",
     "from trl import GRPOConfig, GRPOTrainer\nargs = GRPOConfig('out', fsdp='full_shard auto_wrap', use_vllm=True)\n"
     "GRPOTrainer(model=model, reward_funcs=f, args=args, train_dataset=ds)\n",
     {"trl": "0.17.0"}, {}, False),
    ("peft-dora-fsdp1-magnitude-on-base-layer",
     "from peft import LoraConfig, get_peft_model\nfrom torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
     "model = FSDP(get_peft_model(model, LoraConfig(r=8, use_dora=False)), use_orig_params=True)\n",
     {"peft": "0.11.1"}, {}, False),
    # use_dora given through a name the file binds.
    ("peft-dora-fsdp1-magnitude-on-base-layer",
     "from peft import LoraConfig, get_peft_model\nfrom transformers import Trainer, TrainingArguments\nDORA = True\n"
     "model = get_peft_model(model, LoraConfig(r=8, use_dora=DORA))\n"
     "Trainer(model=model, args=TrainingArguments('out', fsdp='full_shard auto_wrap'), train_dataset=ds).train()\n",
     {"peft": "0.10.0"}, {}, True),
    # FSDP2's default state dict type for accelerate is SHARDED_STATE_DICT: no full state dict is gathered.
    ("bitsandbytes-4bit-fsdp2-full-state-dict", _FSDP2_SAVE, {"bitsandbytes": "0.49.2"}, {"accelerate_config": _FSDP2}, False),
    ("bitsandbytes-4bit-fsdp2-full-state-dict", _FSDP2_SAVE, {"bitsandbytes": "0.49.2"},
     {"accelerate_config": _FSDP2 + "  fsdp_state_dict_type: FULL_STATE_DICT\n"}, True),
    ("bitsandbytes-4bit-quant-storage-ignored",
     "from transformers import BitsAndBytesConfig, Trainer, TrainingArguments\n"
     "bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage='bfloat16')\n"
     "Trainer(model=model, args=TrainingArguments('out', fsdp='full_shard auto_wrap')).train()\n",
     {"bitsandbytes": "0.42.0"}, {}, True),
    # No float storage asked for: the uint8 storage is FSDP202's finding, not this release's bug.
    ("bitsandbytes-4bit-quant-storage-ignored",
     "from transformers import BitsAndBytesConfig, Trainer, TrainingArguments\nbnb = BitsAndBytesConfig(load_in_4bit=True)\n"
     "Trainer(model=model, args=TrainingArguments('out', fsdp='full_shard auto_wrap')).train()\n",
     {"bitsandbytes": "0.42.0"}, {}, False),
    ("transformers-ga-no-sync-last-micro-batch",
     "from transformers import Trainer, TrainingArguments\n"
     "args = TrainingArguments('out', fsdp='full_shard auto_wrap', gradient_accumulation_steps=1)\n"
     "Trainer(model=model, args=args).train()\n",
     {"transformers": "4.46.2"}, {}, False),
    # The accelerate config's FSDP1 with the Trainer's accumulation.
    ("transformers-ga-no-sync-last-micro-batch",
     "from transformers import Trainer, TrainingArguments\nargs = TrainingArguments('out', gradient_accumulation_steps=8)\n"
     "Trainer(model=model, args=args).train()\n",
     {"transformers": "4.46.2"}, {"accelerate_config": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n"}, True),
    # Not FSDP: the DDP-only Trainer job is out of this tool's scope.
    ("transformers-fsdp1-trainer-keeps-unwrapped-model",
     "from transformers import Trainer, TrainingArguments\nTrainer(model=model, args=TrainingArguments('out')).train()\n",
     {"transformers": "4.53.0"}, {}, False),
    ("transformers-trainer-fsdp2-delayed-optimizer",
     "from transformers import Trainer, TrainingArguments\nTrainer(model=model, args=TrainingArguments('out', fsdp='full_shard')).train()\n",
     {"transformers": "4.50.3"}, {}, False),
]


@pytest.mark.parametrize("code", [
    # trl's helper returns None unless the launch asks for adapters.
    _QLORA + "from trl import get_peft_config\nDPOTrainer(model=model, args=args, train_dataset=ds, peft_config=get_peft_config(model_args))\n",
    # A parameter of the function: its value is the caller's.
    _QLORA + "def build(peft_config):\n    return DPOTrainer(model=model, args=args, train_dataset=ds, peft_config=peft_config)\n",
])
def test_peft_config_fsdplint_cannot_read_only_warns(code):
    found = [f for f in lint_example(RULE, Valid(code, target={"trl": "0.28.0"}))
             if "trl-dpo-qlora-fsdp1-kbit-upcast" in f.message]
    assert found and all(f.severity.value == "warning" for f in found)
    assert "may be None at run time" in found[0].message


@pytest.mark.parametrize("adv_id,code,target,options,fires", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_trigger_shapes(adv_id, code, target, options, fires):
    adv = BY_ID[adv_id]
    found = [f for f in lint_example(RULE, Valid(code, target=target, options=options))
             if f.code == "FSDP601" and adv_id in f.message]
    assert bool(found) is fires, [f.message[:200] for f in found]
    if fires:
        assert (f"Fixed in {adv.library} {adv.fixed}" if adv.fixed else "No release fixes it yet") in found[0].message
