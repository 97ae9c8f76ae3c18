import argparse
import os

import torch
import yaml
from accelerate import Accelerator, InitProcessGroupKwargs
from diffusers import QwenImageTransformer2DModel
from peft import LoraConfig


def set_fsdp2_env():
    os.environ["ACCELERATE_USE_FSDP"] = "true"
    os.environ["FSDP_VERSION"] = "2"
    os.environ["FSDP_AUTO_WRAP_POLICY"] = "TRANSFORMER_BASED_WRAP"
    os.environ["FSDP_TRANSFORMER_CLS_TO_WRAP"] = "QwenImageTransformerBlock"
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "false"
    os.environ["FSDP_RESHARD_AFTER_FORWARD"] = "true"  # FSDP2's FULL_SHARD
    os.environ["FSDP_STATE_DICT_TYPE"] = "SHARDED_STATE_DICT"


def main(cfg):
    set_fsdp2_env()
    init_handler = InitProcessGroupKwargs()
    accelerator = Accelerator(mixed_precision="bf16", kwargs_handlers=[init_handler])
    transformer = QwenImageTransformer2DModel.from_pretrained(cfg["pretrained_model_name_or_path"], subfolder="transformer", torch_dtype=torch.bfloat16)
    transformer.requires_grad_(False)
    transformer.add_adapter(LoraConfig(r=cfg["rank"], lora_alpha=cfg["rank"], init_lora_weights="gaussian", target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
    params = [p for p in transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg["learning_rate"])
    transformer, optimizer = accelerator.prepare(transformer, optimizer)
    # ... training loop ...


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    a = p.parse_args()
    with open(a.config) as f:
        main(yaml.safe_load(f))
