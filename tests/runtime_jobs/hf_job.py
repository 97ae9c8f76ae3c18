"""fsdplint.guard with a real HF Trainer and a real accelerate Accelerator.

usage: torchrun --standalone --nproc-per-node 2 hf_job.py OUT_DIR
On CPU, Trainer and accelerate fall back to DDP; the guard must run on every
rank after wrapping, find nothing on a correct job, and let training go on.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny  # noqa: E402

import fsdplint  # noqa: E402


class Tokens(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        ids = (torch.arange(16) + i) % tiny.CONFIG["vocab_size"]
        return {"input_ids": ids, "labels": ids}


def with_trainer(out_dir):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=os.path.join(out_dir, "trainer"),
        max_steps=2,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(model=tiny.add_lora(tiny.base_model()), args=args, train_dataset=Tokens())
    fsdplint.guard.attach(trainer)
    result = trainer.train()
    callback = next(c for c in trainer.callback_handler.callbacks if isinstance(c, fsdplint.guard.FSDPLintCallback))
    return {"findings": callback.findings, "steps": result.global_step}


def with_accelerate():
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = tiny.add_lora(tiny.base_model())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    model, opt = fsdplint.guard.prepare(accelerator, model, opt)
    stale = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    try:
        fsdplint.check(model, stale)
        raised = None
    except fsdplint.FSDPLintError as e:
        raised = sorted({f.code for f in e.findings})
    return {"model": type(model).__name__, "stale_optimizer": raised}


if __name__ == "__main__":
    out_dir = sys.argv[1]
    dist.init_process_group("gloo")
    result = {"trainer": with_trainer(out_dir), "accelerate": with_accelerate()}
    with open(os.path.join(out_dir, f"hf{dist.get_rank()}.json"), "w") as fh:
        json.dump(result, fh)
    dist.barrier()
    dist.destroy_process_group()
