# The shape of bitsandbytes-foundation/bitsandbytes#1709: an 8-bit bitsandbytes model (int8 weights
# beside float16 norms and embeddings) wrapped whole by FSDP1.
import os, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], dtype=torch.float16,
                                             quantization_config=BitsAndBytesConfig(load_in_8bit=True))
model = FSDP(model, device_id=local_rank, use_orig_params=True)  # BUG
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
