import functools
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.gpt2.modeling_gpt2 import GPT2Block

rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl")

tokenizer = AutoTokenizer.from_pretrained("gpt2")
model = AutoModelForCausalLM.from_pretrained("gpt2")
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={GPT2Block})
model = FSDP(model, auto_wrap_policy=policy, device_id=rank, use_orig_params=True)

inputs = tokenizer("Hello, my dog is", return_tensors="pt").to(rank)
with torch.no_grad(), FSDP.summon_full_params(model, writeback=False, recurse=False):
    output = model.module.generate(**inputs, max_new_tokens=20, do_sample=False)
print(tokenizer.decode(output[0]))
