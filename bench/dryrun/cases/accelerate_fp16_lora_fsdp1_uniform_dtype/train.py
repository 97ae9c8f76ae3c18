# The setup of huggingface/accelerate#1620 (from huggingface/peft#484, h2oai/h2o-llmstudio#98): a model
# loaded in float16, LoRA from get_peft_model (peft keeps the adapters in float32), gradient
# checkpointing, then accelerator.prepare under an FSDP1 config that wraps each decoder layer
# (TRANSFORMER_BASED_WRAP, mixed_precision fp16): each layer's unit flattens float16 and float32 together.
import sys

import torch
from accelerate import Accelerator
from peft import LoraConfig, TaskType, get_peft_model
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, get_linear_schedule_with_warmup

accelerator = Accelerator()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float16)
peft_config = LoraConfig(task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=32, lora_dropout=0.05,
                         target_modules=["q_proj", "v_proj"])
model = get_peft_model(model, peft_config)
model.print_trainable_parameters()
model.gradient_checkpointing_enable()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
ids = torch.ones(8, 16, dtype=torch.long)
loader = DataLoader([{"input_ids": r, "labels": r} for r in ids], batch_size=2)
scheduler = get_linear_schedule_with_warmup(opt, num_warmup_steps=0, num_training_steps=len(loader))
model, opt, loader, scheduler = accelerator.prepare(model, opt, loader, scheduler)  # BUG
for batch in loader:
    loss = model(**batch).loss
    accelerator.backward(loss)
    opt.step()
    scheduler.step()
    opt.zero_grad()
