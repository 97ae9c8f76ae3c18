"""FSDP1 + LoRA with the weights loaded on rank 0 only: the other ranks build the model on meta and
FSDP materializes it with `to_empty`; `--sync` passes sync_module_states=True to broadcast rank 0's."""
import argparse, functools, os
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from peft.utils.other import fsdp_auto_wrap_policy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

parser = argparse.ArgumentParser()
parser.add_argument("--sync", action="store_true")
args = parser.parse_args()
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
model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), device_id=local_rank,
             sync_module_states=args.sync,
             param_init_fn=None if rank == 0 else lambda m: m.to_empty(device=torch.device("cuda"), recurse=False))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
batch = tok(["hello world the cat"], return_tensors="pt").to("cuda")
out = model(**batch, labels=batch["input_ids"])
out.loss.backward()
opt.step()
