import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


class DummyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.param = torch.nn.Parameter(torch.ones(8))

    def forward(self, x):
        return self.param * x


rank = int(os.environ["RANK"])
torch_device = torch.device("cuda", rank)
torch.set_default_device(torch_device)
torch.cuda.set_device(rank)
dist.init_process_group(backend="nccl", timeout=timedelta(seconds=5), device_id=torch_device)

model = DummyModel()
fully_shard(model)
model(torch.ones(8)).sum().backward()  # warm-up pass before the optimizer exists
optim = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    optim.zero_grad()
    model(torch.ones(8)).sum().backward()
    optim.step()
print("FSDP2", model.param)
