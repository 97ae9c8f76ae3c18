"""FSDP1 + LoRA trained in the job's own loop over a DataLoader, then the adapter saved at the end.
`--save sharded`: `model.save_pretrained(out)` straight from the wrapped model (what it writes is taken
from the flat shards); `--save full`: every rank gathers a FULL_STATE_DICT and rank 0 writes it;
`--save lora-file`: every rank gathers it and rank 0 writes its LoRA entries with safetensors itself;
`--save rank0`: rank 0 alone gathers it (under its rank test) and writes it with torch.save."""
import argparse, os
import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from peft.utils.other import fsdp_auto_wrap_policy
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer

parser = argparse.ArgumentParser()
parser.add_argument("--save", choices=["sharded", "full", "lora-file", "rank0"], default="sharded")
parser.add_argument("--out", default="adapter_out")
args = parser.parse_args()
dist.init_process_group("nccl")
rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
tok = AutoTokenizer.from_pretrained(os.environ["MODEL"])
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], torch_dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), device_id=local_rank)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
texts = ["hello world the cat", "the dog sat on the mat"] * 8
loader = DataLoader(texts, batch_size=2)
for epoch in range(3):
    for text in loader:
        batch = tok(list(text), return_tensors="pt", padding=True).to("cuda")
        out = model(**batch, labels=batch["input_ids"])
        out.loss.backward()
        opt.step()
        opt.zero_grad()
if args.save == "sharded":
    model.save_pretrained(args.out)
elif args.save == "full":
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        state = model.state_dict()
    if rank == 0:
        model.module.save_pretrained(args.out, state_dict=state)
elif args.save == "lora-file":
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        state = model.state_dict()
    if rank == 0:
        from safetensors.torch import save_file
        lora = {k.replace(".default", ""): v.contiguous() for k, v in state.items() if "lora_" in k}
        model.module.peft_config["default"].save_pretrained(args.out)
        save_file(lora, os.path.join(args.out, "adapter_model.safetensors"))
elif rank == 0:
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        full = model.state_dict()
    os.makedirs(args.out, exist_ok=True)
    torch.save(full, os.path.join(args.out, "model.pt"))
dist.barrier()
