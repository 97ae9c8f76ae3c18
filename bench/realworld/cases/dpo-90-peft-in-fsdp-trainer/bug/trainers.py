import functools
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from omegaconf import DictConfig
from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy


def get_block_class_from_model(model: nn.Module, block_name: str) -> type:
    for module in model.modules():
        if module.__class__.__name__ == block_name:
            return module.__class__
    raise ValueError(f"no {block_name} in the model")


class BasicTrainer:
    def __init__(self, policy: nn.Module, config: DictConfig, seed: int, run_dir: str,
                 reference_model: Optional[nn.Module] = None, rank: int = 0, world_size: int = 1):
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.config = config
        self.run_dir = run_dir
        self.policy = policy
        self.reference_model = reference_model

    def clip_gradient(self):
        return torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.config.max_grad_norm).item()

    def train(self):
        self.optimizer = torch.optim.RMSprop(self.policy.parameters(), lr=self.config.lr)
        for batch in self.batches():
            loss = self.loss(batch)
            loss.backward()
            self.clip_gradient()
            self.optimizer.step()
            self.optimizer.zero_grad()


class FSDPTrainer(BasicTrainer):
    def __init__(self, policy: nn.Module, config: DictConfig, seed: int, run_dir: str,
                 reference_model: Optional[nn.Module] = None, rank: int = 0, world_size: int = 1):
        super().__init__(policy, config, seed, run_dir, reference_model, rank, world_size)
        wrap_class = get_block_class_from_model(policy, config.model.block_name)
        model_auto_wrap_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={wrap_class})

        shared_fsdp_kwargs = dict(
            auto_wrap_policy=model_auto_wrap_policy,
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            cpu_offload=CPUOffload(offload_params=False),
            backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
            device_id=rank,
            use_orig_params=False,
            sync_module_states=False,
        )
        mp_dtype = getattr(torch, config.model.fsdp_policy_mp) if config.model.fsdp_policy_mp else None
        policy_mp = MixedPrecision(param_dtype=mp_dtype, reduce_dtype=mp_dtype, buffer_dtype=mp_dtype)
        self.policy = FSDP(policy, **shared_fsdp_kwargs, mixed_precision=policy_mp)
        if reference_model is not None:
            self.reference_model = FSDP(reference_model, **shared_fsdp_kwargs)
        dist.barrier()

    def clip_gradient(self):
        return self.policy.clip_grad_norm_(self.config.max_grad_norm).item()
