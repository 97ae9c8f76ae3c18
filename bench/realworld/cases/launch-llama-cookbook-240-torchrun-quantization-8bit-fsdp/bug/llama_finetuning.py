import os

import fire
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model, prepare_model_for_int8_training
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import LlamaForCausalLM, LlamaTokenizer
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from configs import fsdp_config as FSDP_CONFIG
from configs import train_config as TRAIN_CONFIG


def update_config(config, **kwargs):
    for k, v in kwargs.items():
        if hasattr(config, k):
            setattr(config, k, v)


def main(**kwargs):
    train_config, fsdp_config = TRAIN_CONFIG(), FSDP_CONFIG()
    update_config(train_config, **kwargs)
    update_config(fsdp_config, **kwargs)

    if train_config.enable_fsdp:
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)

    model = LlamaForCausalLM.from_pretrained(
        train_config.model_name,
        load_in_8bit=True if train_config.quantization else None,
        device_map="auto" if train_config.quantization else None,
    )
    if fsdp_config.pure_bf16:
        model.to(torch.bfloat16)
    if train_config.quantization:
        model = prepare_model_for_int8_training(model)

    tokenizer = LlamaTokenizer.from_pretrained(train_config.model_name)
    tokenizer.add_special_tokens({"pad_token": "<PAD>"})

    if train_config.use_peft:
        peft_config = LoraConfig(r=8, lora_alpha=32, target_modules=["q_proj", "v_proj"], lora_dropout=0.05, task_type="CAUSAL_LM")
        model = get_peft_model(model, peft_config)
        model.print_trainable_parameters()

    if train_config.enable_fsdp:
        wrapping_policy = transformer_auto_wrap_policy
        model = FSDP(
            model,
            auto_wrap_policy=lambda m, r, n: wrapping_policy(m, r, n, transformer_layer_cls={LlamaDecoderLayer}),
            sharding_strategy=fsdp_config.sharding_strategy,
            device_id=torch.cuda.current_device(),
            limit_all_gathers=True,
        )

    optimizer = torch.optim.AdamW(model.parameters(), lr=train_config.lr, weight_decay=0.0)
    return model, optimizer


if __name__ == "__main__":
    fire.Fire(main)
