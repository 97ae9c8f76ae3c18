# The shape of huggingface/trl#1723: float32 LoRA adapters and the bf16 frozen base in one
# FSDP1 unit with use_orig_params=False.
import os, functools, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
model = FSDP(model, device_id=torch.cuda.current_device(), use_orig_params=False)  # BUG
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
