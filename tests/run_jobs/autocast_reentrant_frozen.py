import functools, os, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
from peft import LoraConfig, get_peft_model
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
# FSDP1 under CUDA autocast, with reentrant activation checkpointing of every layer over the frozen
# base and no enable_input_require_grads(): the checkpointed layers' outputs need no grad.
dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], dtype=torch.float32)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}), device_id=rank, use_orig_params=True,
             mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, LlamaDecoderLayer),
                               checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                                       checkpoint_impl=CheckpointImpl.REENTRANT))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
ids = torch.randint(0, 100, (2, 8)).cuda()
with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
    loss = model(input_ids=ids, labels=ids).loss
loss.backward()
opt.step()
