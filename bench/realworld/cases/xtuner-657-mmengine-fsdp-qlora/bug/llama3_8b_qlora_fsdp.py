from functools import partial

import torch
from mmengine.optim import AmpOptimWrapper
from peft import LoraConfig
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
from torch.optim import AdamW
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
from xtuner.model import SupervisedFinetune

pretrained_model_name_or_path = "meta-llama/Meta-Llama-3-8B"
use_varlen_attn = False
lr = 2e-4

tokenizer = dict(
    type=AutoTokenizer.from_pretrained,
    pretrained_model_name_or_path=pretrained_model_name_or_path,
    trust_remote_code=True,
    padding_side="right",
)

model = dict(
    type=SupervisedFinetune,
    use_varlen_attn=use_varlen_attn,
    llm=dict(
        type=AutoModelForCausalLM.from_pretrained,
        pretrained_model_name_or_path=pretrained_model_name_or_path,
        trust_remote_code=True,
        torch_dtype=torch.float16,
        quantization_config=dict(
            type=BitsAndBytesConfig,
            load_in_4bit=True,
            load_in_8bit=False,
            llm_int8_threshold=6.0,
            llm_int8_has_fp16_weight=False,
            bnb_4bit_compute_dtype=torch.float16,
            bnb_4bit_use_double_quant=True,
            bnb_4bit_quant_type="nf4",
        ),
    ),
    lora=dict(type=LoraConfig, r=64, lora_alpha=16, lora_dropout=0.1, bias="none", task_type="CAUSAL_LM"),
)

optim_wrapper = dict(
    type=AmpOptimWrapper,
    optimizer=dict(type=AdamW, lr=lr, betas=(0.9, 0.999), weight_decay=0),
    clip_grad=dict(max_norm=1, error_if_nonfinite=False),
    accumulative_counts=16,
    loss_scale="dynamic",
    dtype="float16",
)

model_wrapper_cfg = dict(type="MMFullyShardedDataParallel", cpu_offload=True, use_orig_params=True)

size_based_auto_wrap_policy = partial(size_based_auto_wrap_policy, min_num_params=1e5)
strategy = dict(type="FSDPStrategy", model_wrapper=dict(auto_wrap_policy=size_based_auto_wrap_policy))
