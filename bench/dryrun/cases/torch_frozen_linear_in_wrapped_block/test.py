# The setup of pytorch/pytorch#104690: a PEFT-style model in plain torch where each attention block has
# a trainable and a frozen projection, wrapped by FSDP1 with transformer_auto_wrap_policy on the block
# class (use_orig_params=False, the default): one unit, two requires_grad values.
import functools
import os

import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

torch.distributed.init_process_group(backend="nccl", init_method="env://",
                                     world_size=int(os.environ["WORLD_SIZE"]), rank=int(os.environ["RANK"]))
torch.cuda.set_device(int(os.environ["RANK"]))
torch.distributed.barrier()


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(100, 100)
        self.k_frozen = nn.Linear(100, 100)
        for p in self.k_frozen.parameters():
            p.requires_grad = False

    def forward(self, x):
        return self.q(x) + self.k_frozen(x)


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(100, 400)
        self.down = nn.Linear(400, 100)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = Attention()
        self.ffn = FeedForward()

    def forward(self, x):
        return x + self.ffn(x + self.attention(x))


class Model(nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(n))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


model = Model().cuda()
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
model = FSDP(model, auto_wrap_policy=policy, sharding_strategy=ShardingStrategy.FULL_SHARD,  # BUG
             mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16),
             device_id=torch.cuda.current_device())
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
loss = model(torch.randn(2, 100).cuda()).sum()
loss.backward()
optimizer.step()
