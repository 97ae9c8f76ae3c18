import os, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import fully_shard
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
tok = AutoTokenizer.from_pretrained(os.environ["MODEL"])
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], torch_dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
for layer in model.base_model.model.model.layers:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
batch = tok(["hello world the cat"], return_tensors="pt").to("cuda")
out = model(**batch, labels=batch["input_ids"])
out.loss.backward()
opt.step()
print("done")
