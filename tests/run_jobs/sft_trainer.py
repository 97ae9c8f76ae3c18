import os
import sys

import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import BitsAndBytesConfig
from trl import SFTConfig, SFTTrainer

model_dir, storage = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
checkpointing = "--gradient_checkpointing" in sys.argv[3:]
init = {"dtype": "bfloat16"}
if storage:  # QLoRA: 4-bit weights stored in `storage` elements
    init["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                     bnb_4bit_compute_dtype=torch.bfloat16,
                                                     bnb_4bit_quant_storage=getattr(torch, storage))
ds = load_dataset("json", data_files="data.jsonl", split="train")
# FSDP from the Trainer's own arguments, unless `accelerate launch` gave an FSDP config.
fsdp = {} if os.environ.get("ACCELERATE_USE_FSDP") else dict(
    fsdp="full_shard auto_wrap", fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})
args = SFTConfig(output_dir="out", per_device_train_batch_size=1, max_steps=2, bf16=True, report_to=[],
                 save_strategy="no", max_length=16, model_init_kwargs=init, gradient_checkpointing=checkpointing, **fsdp)
trainer = SFTTrainer(model=model_dir, args=args, train_dataset=ds,
                     peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
trainer.train()
