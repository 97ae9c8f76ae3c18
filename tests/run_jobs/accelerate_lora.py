import json, sys, torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import LoraConfig, get_peft_model
model_dir, data = sys.argv[1], sys.argv[2]
dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.bfloat16  # what the model loads in
acc = Accelerator()
tok = AutoTokenizer.from_pretrained(model_dir)
rows = [json.loads(l) for l in open(data)]
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, opt = acc.prepare(model, opt)
batch = tok([r["text"] for r in rows], return_tensors="pt", padding=True).to(acc.device)
loss = model(**batch, labels=batch["input_ids"]).loss
acc.backward(loss)
opt.step()
