import os, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import fully_shard
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], torch_dtype=torch.bfloat16)
for layer in model.model.layers:
    fully_shard(layer)
fully_shard(model)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
ids = torch.ones(1, 8, dtype=torch.long).cuda()
model(input_ids=ids).logits.sum().backward()
opt.step()
