"""lit-llama finetune/lora.py with FSDP turned on through the Fabric strategy."""
import time
from functools import partial
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.strategies import FSDPStrategy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from lit_llama.lora import lora, lora_state_dict, mark_only_lora_as_trainable
from lit_llama.model import LLaMA, Block, LLaMAConfig

lora_r = 8
lora_alpha = 16
lora_dropout = 0.05
learning_rate = 3e-4
max_iters = 50000


def main(data_dir: Path = Path("data/alpaca"), pretrained_path: Path = Path("checkpoints/lit-llama/7B/lit-llama.pth"), out_dir: Path = Path("out/lora/alpaca")):
    auto_wrap_policy = partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    strategy = FSDPStrategy(auto_wrap_policy=auto_wrap_policy, activation_checkpointing=Block)
    fabric = L.Fabric(accelerator="cuda", devices=4, precision="bf16-mixed", strategy=strategy)
    fabric.launch()
    fabric.seed_everything(1337 + fabric.global_rank)

    config = LLaMAConfig.from_name("7B")
    config.block_size = 512
    checkpoint = torch.load(pretrained_path)

    with fabric.init_module(), lora(r=lora_r, alpha=lora_alpha, dropout=lora_dropout, enabled=True):
        model = LLaMA(config)
        model.load_state_dict(checkpoint, strict=False)

    mark_only_lora_as_trainable(model)

    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    model, optimizer = fabric.setup(model, optimizer)
    train(fabric, model, optimizer, data_dir, out_dir)

    checkpoint = lora_state_dict(model)
    fabric.save(out_dir / "lit-llama-lora-finetuned.pth", checkpoint)


def train(fabric, model, optimizer, data_dir, out_dir):
    for iter_num in range(max_iters):
        t0 = time.time()
        input_ids, targets = torch.load(data_dir / "batch.pt")
        logits = model(input_ids)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    from jsonargparse.cli import CLI

    CLI(main)
