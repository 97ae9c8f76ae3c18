from dataclasses import dataclass

from torch.distributed.fsdp import ShardingStrategy


@dataclass
class fsdp_config:
    mixed_precision: bool = True
    use_fp16: bool = False
    sharding_strategy: ShardingStrategy = ShardingStrategy.FULL_SHARD
    pure_bf16: bool = False
