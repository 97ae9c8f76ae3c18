import os

import torch
from torch import distributed, nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

local_rank = int(os.getenv("LOCAL_RANK", 0))
world_size = int(os.getenv("WORLD_SIZE", 1))
distributed.init_process_group(backend="nccl", rank=local_rank, world_size=world_size)
device = torch.device("cuda", local_rank)
torch.cuda.set_device(device)
print(local_rank, world_size, device)

layer = nn.Linear(100, 100)
layer.to(device)
wrapped = FSDP(layer, device_id=local_rank)
out = wrapped(torch.randn((1, 100), device=device))
