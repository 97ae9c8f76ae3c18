import functools
import os

import torch
import torch.distributed as dist
from modeling_chatglm import ChatGLMForConditionalGeneration, GLMBlock
from peft import LoraConfig, TaskType, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import AutoConfig

BASE_DIR = os.environ.get("CHATGLM_DIR", "./chatglm-6b")


def train(rank, world_size):
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    config = AutoConfig.from_pretrained(BASE_DIR, trust_remote_code=True)
    model = ChatGLMForConditionalGeneration.from_pretrained(pretrained_model_name_or_path=BASE_DIR, config=config)
    print("model loaded")

    peft_config = LoraConfig(task_type=TaskType.CAUSAL_LM, inference_mode=False, r=12, lora_alpha=32, lora_dropout=0.1)
    model = get_peft_model(model, peft_config=peft_config)
    print("peft model loaded")
    model.print_trainable_parameters()

    torch.cuda.set_device(rank)
    glm_auto_wrap_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={GLMBlock})
    model = FullyShardedDataParallel(
        model,
        auto_wrap_policy=glm_auto_wrap_policy,
        mixed_precision=MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16, buffer_dtype=torch.float16),
        device_id=torch.cuda.current_device(),
        use_orig_params=True,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, optimizer


if __name__ == "__main__":
    train(int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]))
