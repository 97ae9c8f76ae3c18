"""FSDP2 + LoRA, weights loaded on rank 0 only: every other rank builds on meta, shards, and
materializes with to_empty(); `--broadcast` then fills every rank from rank 0's full state dict."""
import os, sys
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import fully_shard
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

dist.init_process_group("nccl")
rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
path = os.environ["MODEL"]
tok = AutoTokenizer.from_pretrained(path)
if rank == 0:
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16)
else:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), torch_dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
full_sd = model.state_dict() if rank == 0 else {}
for layer in model.base_model.model.model.layers:
    fully_shard(layer)
fully_shard(model)
if rank != 0:
    model.to_empty(device="cuda")
if "--broadcast" in sys.argv:
    set_model_state_dict(model, full_sd, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
batch = tok(["hello world the cat"], return_tensors="pt").to("cuda")
out = model(**batch, labels=batch["input_ids"])
out.loss.backward()
opt.step()
