import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from datasets import load_dataset
from transformers import DataCollatorForLanguageModeling

from tabula import Tabula


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)


def main(rank, world_size):
    setup(rank, world_size)
    model = Tabula(llm="distilgpt2", epochs=50, batch_size=16)
    data = load_dataset("csv", data_files="train.csv")["train"]
    collator = DataCollatorForLanguageModeling(model.tokenizer, mlm=False)
    model.fit(data, collator)
    print(model.sample(n_samples=10, start_tokens="age", device=f"cuda:{rank}"))
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = torch.cuda.device_count()
    mp.spawn(main, args=(world_size,), nprocs=world_size, join=True)
