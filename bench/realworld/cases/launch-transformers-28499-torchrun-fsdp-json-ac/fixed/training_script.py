from dataclasses import dataclass, field

import torch
from datasets import load_dataset
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
)


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="meta-llama/Llama-2-7b-hf")
    max_length: int = field(default=2048)


def train_model(model_args, training_args):
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, torch_dtype=torch.bfloat16, use_cache=False)
    ds = load_dataset("tatsu-lab/alpaca", split="train")
    ds = ds.map(lambda b: tokenizer(b["text"], truncation=True, max_length=model_args.max_length), batched=True, remove_columns=ds.column_names)
    trainer = Trainer(model=model, args=training_args, train_dataset=ds, data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    checkpoint = None
    train_result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model()
    return train_result


if __name__ == "__main__":
    parser = HfArgumentParser((ModelArguments, TrainingArguments))
    model_args, training_args = parser.parse_args_into_dataclasses()
    train_model(model_args, training_args)
