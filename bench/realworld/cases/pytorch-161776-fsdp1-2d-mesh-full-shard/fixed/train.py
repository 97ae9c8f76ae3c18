import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
from transformers import AutoModelForCausalLM

local_rank = int(os.environ["LOCAL_RANK"])
device = torch.device("cuda", local_rank)
torch.cuda.set_device(device)
dist.init_process_group("nccl")

model = AutoModelForCausalLM.from_pretrained(os.environ.get("MODEL", "Qwen/Qwen2.5-7B"))

device_mesh = init_device_mesh(
    "cuda",
    mesh_shape=(8,),
    mesh_dim_names=("shard",),
)
model = FSDP(
    model,
    auto_wrap_policy=size_based_auto_wrap_policy,
    device_id=device,
    # sharding_strategy=ShardingStrategy.FULL_SHARD,
    mixed_precision=MixedPrecision(
        param_dtype=torch.float,
        reduce_dtype=torch.float,
        buffer_dtype=torch.float,
    ),
    sync_module_states=True,
    limit_all_gathers=True,
    use_orig_params=True,
    device_mesh=device_mesh,
)
