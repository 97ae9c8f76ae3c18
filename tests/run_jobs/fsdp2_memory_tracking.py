"""FSDP2 + LoRA measuring each step's GPU memory, as accelerate's fsdp_with_peak_mem_tracking example
does (reset the peak gauge, read it after the step, a summary from memory_stats())."""
import os
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, AutoTokenizer

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
tok = AutoTokenizer.from_pretrained(os.environ["MODEL"])
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], torch_dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
for layer in model.base_model.model.model.layers:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
torch.cuda.empty_cache()
torch.cuda.reset_max_memory_allocated()
torch.cuda.memory.reset_accumulated_memory_stats()
begin = torch.cuda.memory_allocated()
batch = tok(["hello world the cat"], return_tensors="pt").to("cuda")
out = model(**batch, labels=batch["input_ids"])
out.loss.backward()
peak = torch.cuda.max_memory_allocated() - begin
reserved = torch.cuda.max_memory_reserved()
stats = torch.cuda.memory_stats()
print("peak", peak >> 20, "reserved", reserved >> 20, "retries", stats["num_alloc_retries"])
opt.step()
