#pip install transformers accelerate peft bitsandbytes datasets torch

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, \
     TrainingArguments, DataCollatorForLanguageModeling, BitsAndBytesConfig
from datasets import load_dataset
from peft import get_peft_model, LoraConfig


quant_config = BitsAndBytesConfig(
    load_in_4bit=True
)

# Load the model with 4-bit quantization
model = AutoModelForCausalLM.from_pretrained("facebook/opt-125m", quantization_config=quant_config,
                                            device_map='auto')

# Apply LoRA for QLoRA
lora_config = LoraConfig(
    r=16,
    lora_alpha=32,
    target_modules=["q_proj", "v_proj"],
    lora_dropout=0.1,
    bias="none",
)
model = get_peft_model(model, lora_config)

dataset = load_dataset("wikitext", "wikitext-2-raw-v1")
tokenizer = AutoTokenizer.from_pretrained("facebook/opt-125m")

def tokenize_function(examples):
    return tokenizer(examples["text"], truncation=True, max_length=512)

tokenized_dataset = dataset.map(tokenize_function, batched=True, remove_columns=["text"])

data_collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False)

training_args = TrainingArguments(output_dir="./results", per_device_train_batch_size=1)

trainer = Trainer(
    model=model,
    args=training_args,
    train_dataset=tokenized_dataset["train"],
    data_collator=data_collator,
)
trainer.train()
