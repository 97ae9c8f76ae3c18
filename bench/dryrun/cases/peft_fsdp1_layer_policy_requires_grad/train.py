# The setup of pytorch/pytorch#100945 (and h2oai/h2o-llmstudio#98 with a float32 backbone): a model
# loaded in its default float32, LoRA from get_peft_model, then FSDP1 with transformer_auto_wrap_policy
# on the decoder layer class and the default use_orig_params=False. Each decoder layer's unit then holds
# the frozen base weights and the trainable adapters together.
import functools
import os

import torch
import torch.distributed as dist
from peft import LoraConfig, TaskType, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"])
peft_config = LoraConfig(task_type=TaskType.CAUSAL_LM, inference_mode=False, r=12, lora_alpha=32,
                         lora_dropout=0.1, target_modules=["q_proj", "v_proj"])
model = get_peft_model(model, peft_config)
model.print_trainable_parameters()
torch.cuda.set_device(rank)
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
model = FullyShardedDataParallel(model, auto_wrap_policy=policy, device_id=torch.cuda.current_device())  # BUG
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
