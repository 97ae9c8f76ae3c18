# FSDP1 + LoRA with peft's fsdp_auto_wrap_policy (adapters in their own units) and use_orig_params.
import os, functools, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from peft.utils.other import fsdp_auto_wrap_policy

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
os.environ.setdefault("FSDP_TRANSFORMER_CLS_TO_WRAP", "LlamaDecoderLayer")
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]), autocast_adapter_dtype=False)
model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), device_id=torch.cuda.current_device(),
             use_orig_params=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.ones(1, 8, dtype=torch.long).cuda()
model(input_ids=ids, labels=ids).loss.backward()
opt.step()
