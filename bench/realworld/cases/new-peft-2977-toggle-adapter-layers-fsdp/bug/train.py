import functools
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers.models.mistral.modeling_mistral import MistralDecoderLayer

from icae import ICAE


class Wrapper(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = Wrapper(ICAE("mistralai/Mistral-7B-v0.1"))
    # lm_head is left out of the wrap policy: only decoder layers are sharded units
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={MistralDecoderLayer})
    model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True, device_id=torch.cuda.current_device())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    for batch in torch.load("batches.pt"):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
