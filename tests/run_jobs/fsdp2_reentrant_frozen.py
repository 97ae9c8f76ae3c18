import functools, os, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
from peft import LoraConfig, get_peft_model
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
from torch.distributed.fsdp import fully_shard
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
# reentrant checkpointing of every layer over the frozen base, and no enable_input_require_grads()
apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, LlamaDecoderLayer),
                               checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                                       checkpoint_impl=CheckpointImpl.REENTRANT))
for layer in model.base_model.model.model.layers:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
ids = torch.ones(2, 8, dtype=torch.long).cuda()
loss = model(input_ids=ids, labels=ids).loss
loss.backward()
opt.step()
