import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer

accelerator = Accelerator()
name = "Qwen/Qwen2.5-0.5B-Instruct"
tokenizer = AutoTokenizer.from_pretrained(name)
model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
model, optimizer = accelerator.prepare(model, optimizer)

# ... training steps ...

inputs = tokenizer(["The capital of France is"], return_tensors="pt").to(accelerator.device)
unwrapped_model = accelerator.unwrap_model(model)
with torch.no_grad():
    out = unwrapped_model.generate(**inputs, max_new_tokens=20)
accelerator.print(tokenizer.batch_decode(out))
