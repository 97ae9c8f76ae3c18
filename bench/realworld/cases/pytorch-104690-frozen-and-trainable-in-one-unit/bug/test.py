import functools
import os

import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

torch.distributed.init_process_group(
    backend="nccl", init_method="env://", world_size=int(os.environ["WORLD_SIZE"]), rank=int(os.environ["RANK"])
)
torch.cuda.set_device(int(os.environ["RANK"]))
torch.distributed.barrier()


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(100, 100)
        self.k_nograd = nn.Linear(100, 100)
        for param in self.k_nograd.parameters():
            param.requires_grad = False

    def forward(self, x):
        return self.q(x) + self.k_nograd(x)


class FFN(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(100, 100)
        self.w2_nograd = nn.Linear(100, 100)
        for param in self.w2_nograd.parameters():
            param.requires_grad = False

    def forward(self, x):
        return self.w2_nograd(torch.relu(self.w1(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.ffn = FFN()

    def forward(self, x):
        return self.ffn(self.attn(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(4)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


model = Model().cuda()
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
model = FSDP(model, auto_wrap_policy=policy, mixed_precision=mp, sharding_strategy=ShardingStrategy.FULL_SHARD)
