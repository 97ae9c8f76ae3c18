# Trainer + LoRA with dropout over a float32 model, non-reentrant gradient checkpointing, under an
# accelerate FSDP1 config with `mixed_precision: bf16` and `use_orig_params: false` (peft's examples/sft
# launcher's settings): the recomputation's LoRA inputs are bfloat16 where the forward's were float32.
import sys

import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM
from trl import SFTConfig, SFTTrainer

model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
ds = load_dataset("json", data_files="data.jsonl", split="train")
args = SFTConfig(output_dir="out", per_device_train_batch_size=2, max_steps=2, bf16=True, report_to=[],
                 save_strategy="no", max_length=16, gradient_checkpointing=True,
                 gradient_checkpointing_kwargs={"use_reentrant": False})
trainer = SFTTrainer(model=model, args=args, train_dataset=ds,
                     peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules="all-linear",
                                            task_type="CAUSAL_LM"))
trainer.train()
