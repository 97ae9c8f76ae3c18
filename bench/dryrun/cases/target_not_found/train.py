# A LoRA target list written for another architecture (GPT-NeoX/Falcon names on a Llama).
import os, functools, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import fully_shard

dist.init_process_group("nccl")
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["query_key_value"]))  # BUG
fully_shard(model)
