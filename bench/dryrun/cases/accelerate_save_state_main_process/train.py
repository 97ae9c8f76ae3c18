# accelerate launch with FSDP (full sharding) and the reporter's checkpointing: after each epoch every rank
# waits, then the main process alone calls accelerator.save_state(), whose FSDP model/optimizer gathers
# are collectives the other ranks never enter (huggingface/accelerate#2000: hangs in ALLGATHER).
import json, sys, torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir, data = sys.argv[1], sys.argv[2]
config = {"SAVE_STATE": True, "EPOCHS": 2}
save_state_dir = "state"
accelerator = Accelerator()
tok = AutoTokenizer.from_pretrained(model_dir)
texts = [json.loads(l)["text"] for l in open(data)] * 4
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
loader = DataLoader(texts, batch_size=2)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for epoch in range(config["EPOCHS"]):
    model.train()
    for text in loader:
        batch = tok(list(text), return_tensors="pt", padding=True).to(accelerator.device)
        loss = model(**batch, labels=batch["input_ids"]).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if config["SAVE_STATE"]:
            accelerator.save_state(save_state_dir)  # BUG
