"""FSDP1 + LoRA on a sequence-classification head (not in the causal-LM checkpoint: transformers
initializes it) loaded with from_pretrained on every rank; `--sync` passes sync_module_states=True."""
import os, sys
import torch
import torch.distributed as dist
from peft import LoraConfig, TaskType, get_peft_model
from peft.utils.other import fsdp_auto_wrap_policy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from transformers import AutoModelForSequenceClassification, AutoTokenizer

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
path = os.environ["MODEL"]
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2, torch_dtype=torch.bfloat16)
model.config.pad_token_id = tok.pad_token_id
model = get_peft_model(model, LoraConfig(task_type=TaskType.SEQ_CLS, r=8, target_modules=["q_proj", "v_proj"]))
model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), device_id=local_rank,
             sync_module_states="--sync" in sys.argv,
             param_init_fn=lambda m: m.to_empty(device=torch.device("cuda"), recurse=False))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
batch = tok(["hello world the cat"], return_tensors="pt").to("cuda")
out = model(**batch, labels=torch.tensor([1], device="cuda"))
out.loss.backward()
opt.step()
