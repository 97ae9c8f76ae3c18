import os, torch, torch.distributed as dist
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import fully_shard


def to_text(sample):
    return {"text": sample["prompt"] + " " + sample["completion"]}


dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
# Hub ids this machine has not cached (a model config alone is in the cache): the dry run stands in.
tok = AutoTokenizer.from_pretrained("fsdplint-test/tiny-chat", pad_token="<pad>")
data = load_dataset("fsdplint-test/prompt-completion", split="train")
data = data.map(to_text, remove_columns=["prompt", "completion"])
model = AutoModelForCausalLM.from_pretrained("fsdplint-test/tiny-chat", dtype=torch.bfloat16,
                                             attn_implementation="flash_attention_2")
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
for layer in model.base_model.model.model.layers:
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
batch = tok(data[:2]["text"], return_tensors="pt", padding=True).to("cuda")
out = model(**batch, labels=batch["input_ids"])
out.loss.backward()
opt.step()
