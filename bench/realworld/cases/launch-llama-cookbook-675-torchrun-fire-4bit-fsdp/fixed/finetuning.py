import dataclasses
import functools
import os

import fire
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy
from transformers import AutoTokenizer, BitsAndBytesConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from configs import fsdp_config as FSDP_CONFIG
from configs import lora_config as LORA_CONFIG
from configs import train_config as TRAIN_CONFIG


def update_config(config, **kwargs):
    for k, v in kwargs.items():
        if hasattr(config, k):
            setattr(config, k, v)


def fsdp_auto_wrap_policy(model, transformer_layer_names):
    def lambda_policy_fn(module):
        return (
            len(list(module.named_children())) == 0
            and getattr(module, "weight", None) is not None
            and module.weight.requires_grad
        )

    lambda_policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda_policy_fn)
    transformer_wrap_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=set(transformer_layer_names))
    return functools.partial(_or_policy, policies=[lambda_policy, transformer_wrap_policy])


def main(**kwargs):
    train_config, fsdp_config = TRAIN_CONFIG(), FSDP_CONFIG()
    update_config((train_config, fsdp_config), **kwargs)
    update_config(train_config, **kwargs)
    update_config(fsdp_config, **kwargs)

    if train_config.enable_fsdp:
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        rank = int(os.environ["RANK"])
        torch.cuda.set_device(local_rank)

    bnb_config = None
    if train_config.quantization == "4bit":
        bnb_config = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=False,
            bnb_4bit_quant_storage=torch.bfloat16,
        )
    elif train_config.quantization == "8bit":
        bnb_config = BitsAndBytesConfig(load_in_8bit=True)

    model = LlamaForCausalLM.from_pretrained(
        train_config.model_name,
        quantization_config=bnb_config,
        use_cache=None,
        attn_implementation="sdpa",
        device_map="auto" if train_config.quantization and not train_config.enable_fsdp else None,
        torch_dtype=torch.float16 if train_config.use_fp16 else torch.bfloat16,
    )
    tokenizer = AutoTokenizer.from_pretrained(train_config.model_name)
    tokenizer.pad_token_id = tokenizer.eos_token_id

    if train_config.use_peft:
        peft_config = LoraConfig(**dataclasses.asdict(LORA_CONFIG()))
        model = get_peft_model(model, peft_config)
        model.print_trainable_parameters()

    if train_config.enable_fsdp:
        my_auto_wrapping_policy = fsdp_auto_wrap_policy(model, [LlamaDecoderLayer])
        model = FSDP(
            model,
            auto_wrap_policy=my_auto_wrapping_policy,
            sharding_strategy=fsdp_config.sharding_strategy,
            device_id=torch.cuda.current_device(),
            limit_all_gathers=True,
            sync_module_states=train_config.low_cpu_fsdp,
        )

    optimizer = torch.optim.AdamW(model.parameters(), lr=train_config.lr, weight_decay=0.0)
    # ... training loop (train_utils.train) elided: forward/backward/step per batch
    return model, optimizer


if __name__ == "__main__":
    fire.Fire(main)
