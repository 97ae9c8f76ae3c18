import logging

import torch
from accelerate import Accelerator
from peft import LoraConfig, TaskType, get_peft_model
from transformers import AdamW, AutoModelForCausalLM, AutoTokenizer, get_constant_schedule_with_warmup

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s: %(message)s")
logger = logging.getLogger(__name__)
accelerator = Accelerator()

BASE_MODEL = "tiiuae/falcon-7b"
USE_GRADIENT_CHECKPOINTING = True
TARGET_MODULES = ["query_key_value"]

logger.info("Setting up Tokenizer...")
tokenizer = AutoTokenizer.from_pretrained(BASE_MODEL, cache_dir="/app/models/hface_cache")
tokenizer.pad_token = tokenizer.eos_token

logger.info("Loading model...")
model = AutoModelForCausalLM.from_pretrained(
    BASE_MODEL, cache_dir="/app/models/hface_cache", torch_dtype=torch.float16, trust_remote_code=True
)
if USE_GRADIENT_CHECKPOINTING:
    logger.info("Enabling Gradient Checkpointing...")
    model.gradient_checkpointing_enable()

peft_config = LoraConfig(
    task_type=TaskType.CAUSAL_LM, inference_mode=False, r=8, lora_alpha=32, lora_dropout=0.1,
    target_modules=TARGET_MODULES,
)
model = get_peft_model(model, peft_config)
model.print_trainable_parameters()

opt = AdamW(model.parameters(), lr=1e-4)
scheduler = get_constant_schedule_with_warmup(opt, num_warmup_steps=100)

logger.info("Wrapping objects with accelerate...")
model, opt, _, scheduler = accelerator.prepare(model, opt, None, scheduler)
