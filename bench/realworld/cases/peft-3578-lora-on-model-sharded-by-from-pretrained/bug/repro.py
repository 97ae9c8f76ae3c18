# torchrun --nproc_per_node 2 repro.py
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.distributed import DistributedConfig

model_id = "Qwen/Qwen3-30B-A3B"
model = AutoModelForCausalLM.from_pretrained(
    model_id,
    dtype=torch.bfloat16,
    distributed_config=DistributedConfig(fsdp_size=2),
)
model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj"]))

tokenizer = AutoTokenizer.from_pretrained(model_id)
batch = tokenizer(["hello world"], return_tensors="pt").to(model.device)
loss = model(**batch, labels=batch["input_ids"]).loss
loss.backward()
