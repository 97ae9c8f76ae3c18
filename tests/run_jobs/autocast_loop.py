import os, sys, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import fully_shard
# A hand-written loop under CUDA autocast: bf16 through torch.autocast, or fp16 through torch.amp with a
# GradScaler (argv[1] == "fp16"). The base is bf16/fp16, peft keeps the adapters in float32.
half = len(sys.argv) > 1 and sys.argv[1] == "fp16"
dtype = torch.float16 if half else torch.bfloat16
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
tok = AutoTokenizer.from_pretrained(os.environ["MODEL"])
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], dtype=dtype)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
for layer in model.base_model.model.model.layers:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
batch = tok(["hello world the cat", "the dog sat on the mat"], return_tensors="pt", padding=True).to("cuda")
if half:
    scaler = torch.amp.GradScaler("cuda")
    with torch.amp.autocast(device_type="cuda", dtype=torch.float16):
        loss = model(**batch, labels=batch["input_ids"]).loss
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
else:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(**batch, labels=batch["input_ids"])
    out.loss.backward()
    opt.step()
