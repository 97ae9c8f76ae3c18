"""FSDP2 + LoRA where rank 0 alone gathers a sharded parameter (`full_tensor()`, DTensor's all-gather) to
log its norm: the other ranks never enter that all-gather."""
import os
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, AutoTokenizer

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
tok = AutoTokenizer.from_pretrained(os.environ["MODEL"])
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], torch_dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
for layer in model.base_model.model.model.layers:
    fully_shard(layer)
fully_shard(model)
embed = model.get_input_embeddings().weight
if rank == 0 or os.environ.get("EVERY_RANK"):
    print("embedding norm", embed.full_tensor().float().norm().item())
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
batch = tok(["hello world the cat"], return_tensors="pt").to("cuda")
out = model(**batch, labels=batch["input_ids"])
out.loss.backward()
opt.step()
