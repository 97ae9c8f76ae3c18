# The shape of huggingface/alignment-handbook#169 and hiyouga/LlamaFactory#3470: a 4-bit model (uint8
# storage) prepared by accelerate with an FSDP1 config.
import sys, torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model

acc = Accelerator()
q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], quantization_config=q, dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, opt = acc.prepare(model, opt)  # BUG
