import logging
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from torchtitan import utils
from torchtitan.parallelize import apply_fsdp

logger = logging.getLogger(__name__)


def main(model_cls, model_args, data_loader, max_norm=1.0, steps=1000, log_freq=10):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    world_mesh = init_device_mesh("cuda", (dist.get_world_size(),), mesh_dim_names=("dp",))

    with torch.device("meta"):
        model = model_cls(model_args)
    model = apply_fsdp(model, world_mesh["dp"], torch.bfloat16, torch.float32)
    model.to_empty(device="cuda")
    model.init_weights()
    model_parts = [model]
    optimizer = torch.optim.AdamW(model.parameters(), lr=8e-4)

    data_iterator = iter(data_loader)
    for step in range(1, steps + 1):
        input_ids, labels = next(data_iterator)
        optimizer.zero_grad()
        pred = model(input_ids.cuda())
        loss = torch.nn.functional.cross_entropy(pred.flatten(0, 1), labels.cuda().flatten(0, 1))
        del pred
        loss.backward()

        # clip gradients
        grad_norm = utils.clip_grad_norm_(
            [p for m in model_parts for p in m.parameters()],
            max_norm,
            foreach=True,
            pp_mesh=None,
        )
        optimizer.step()

        if step % log_freq == 0:
            logger.info(f"step: {step:2}  loss: {loss.item():7.4f}  grad_norm: {grad_norm.item():7.4f}")
