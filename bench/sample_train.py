"""Fine-tune a causal LM with LoRA under FSDP2 (benchmark input: a typical training script).

Launch with: torchrun --nproc-per-node 8 sample_train.py --model meta-llama/Meta-Llama-3-8B
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from transformers import AutoModelForCausalLM, AutoTokenizer, get_cosine_schedule_with_warmup
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

logger = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    model: str = "meta-llama/Meta-Llama-3-8B"
    data: str = "data/train.jsonl"
    output_dir: str = "checkpoints"
    seq_len: int = 2048
    batch_size: int = 4
    grad_accum: int = 8
    lr: float = 2e-4
    weight_decay: float = 0.0
    warmup_steps: int = 100
    max_steps: int = 2000
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    log_every: int = 10
    save_every: int = 500
    seed: int = 1234


class JsonlDataset(Dataset):
    """Pre-tokenized samples, one JSON object per line with an `input_ids` list."""

    def __init__(self, path: str, seq_len: int, pad_id: int):
        self.samples = []
        with open(path) as fh:
            for line in fh:
                ids = json.loads(line)["input_ids"][:seq_len]
                self.samples.append(ids + [pad_id] * (seq_len - len(ids)))
        self.pad_id = pad_id

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        ids = torch.tensor(self.samples[idx], dtype=torch.long)
        labels = ids.clone()
        labels[ids == self.pad_id] = -100
        return {"input_ids": ids, "labels": labels, "attention_mask": (ids != self.pad_id).long()}


def parse_args() -> TrainConfig:
    parser = argparse.ArgumentParser()
    cfg = TrainConfig()
    for name, value in vars(cfg).items():
        if isinstance(value, list):
            parser.add_argument(f"--{name.replace('_', '-')}", nargs="+", default=value)
        else:
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    return TrainConfig(**vars(parser.parse_args()))


def setup_distributed() -> tuple[int, int, int]:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    return dist.get_rank(), dist.get_world_size(), local_rank


def build_model(cfg: TrainConfig, world_size: int) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(cfg.model, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    model.config.use_cache = False

    lora_config = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=cfg.target_modules,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora_config)
    # Keep LoRA weights in the base dtype so each FSDP unit has one dtype.
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.to(torch.bfloat16)

    wrapper = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: isinstance(m, LlamaDecoderLayer)
    )

    mesh = init_device_mesh("cuda", (world_size,), mesh_dim_names=("dp",))
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for module in model.modules():
        if isinstance(module, LlamaDecoderLayer):
            fully_shard(module, mesh=mesh, mp_policy=mp_policy)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=False)
    return model


def build_optimizer(cfg: TrainConfig, model: torch.nn.Module):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    scheduler = get_cosine_schedule_with_warmup(optimizer, cfg.warmup_steps, cfg.max_steps)
    return optimizer, scheduler


def save_adapter(model: torch.nn.Module, path: Path, rank: int) -> None:
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    if rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        lora_state = {k: v for k, v in state.items() if "lora_" in k}
        torch.save(lora_state, path / "adapter_model.bin")
        logger.info("saved %d LoRA tensors to %s", len(lora_state), path)
    dist.barrier()


def train(cfg: TrainConfig) -> None:
    rank, world_size, local_rank = setup_distributed()
    torch.manual_seed(cfg.seed)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING)

    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    dataset = JsonlDataset(cfg.data, cfg.seq_len, pad_id)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed)
    loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler, num_workers=2, pin_memory=True)

    model = build_model(cfg, world_size)
    optimizer, scheduler = build_optimizer(cfg, model)
    model.train()

    step, micro = 0, 0
    tokens, started = 0, time.perf_counter()
    epoch = 0
    while step < cfg.max_steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            batch = {k: v.to(local_rank, non_blocking=True) for k, v in batch.items()}
            is_last_micro = (micro + 1) % cfg.grad_accum == 0
            model.set_requires_gradient_sync(is_last_micro)
            loss = model(**batch).loss / cfg.grad_accum
            loss.backward()
            tokens += int(batch["attention_mask"].sum())
            micro += 1
            if not is_last_micro:
                continue

            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1

            if step % cfg.log_every == 0 and rank == 0:
                elapsed = time.perf_counter() - started
                logger.info(
                    "step %d loss %.4f ppl %.2f grad_norm %.3f lr %.2e tok/s %.0f",
                    step,
                    loss.item() * cfg.grad_accum,
                    math.exp(min(loss.item() * cfg.grad_accum, 20)),
                    grad_norm.item(),
                    scheduler.get_last_lr()[0],
                    tokens * world_size / elapsed,
                )
            if step % cfg.save_every == 0:
                save_adapter(model, Path(cfg.output_dir) / f"step-{step}", rank)
            if step >= cfg.max_steps:
                break
        epoch += 1

    save_adapter(model, Path(cfg.output_dir) / "final", rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    train(parse_args())
