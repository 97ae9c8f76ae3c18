import os

import hydra
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import transformers
from omegaconf import DictConfig
from peft import LoraConfig, get_peft_model

import trainers


def worker_main(rank: int, world_size: int, config: DictConfig, policy: nn.Module, reference_model=None):
    if "FSDP" in config.trainer:
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ["MASTER_PORT"] = str(config.fsdp_port or 12355)
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
    trainer_class = getattr(trainers, config.trainer)
    trainer = trainer_class(policy, config, config.seed, os.getcwd(), reference_model=reference_model,
                            rank=rank, world_size=world_size)
    trainer.train()


@hydra.main(version_base=None, config_path="config", config_name="config")
def main(config: DictConfig):
    policy_dtype = getattr(torch, config.model.policy_dtype)
    policy = transformers.AutoModelForCausalLM.from_pretrained(
        config.model.name_or_path, low_cpu_mem_usage=True, torch_dtype=policy_dtype)

    peft_config = LoraConfig(
        r=config.lora.r,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
    )
    policy = get_peft_model(policy, peft_config)

    reference_dtype = getattr(torch, config.model.reference_dtype)
    reference_model = transformers.AutoModelForCausalLM.from_pretrained(
        config.model.name_or_path, low_cpu_mem_usage=True, torch_dtype=reference_dtype)

    if "FSDP" in config.trainer:
        world_size = torch.cuda.device_count()
        mp.spawn(worker_main, nprocs=world_size, args=(world_size, config, policy, reference_model), join=True)
    else:
        worker_main(0, 1, config, policy, reference_model)


if __name__ == "__main__":
    main()
