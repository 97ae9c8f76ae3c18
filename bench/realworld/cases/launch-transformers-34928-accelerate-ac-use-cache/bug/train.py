import argparse

import torch
import yaml
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer, TrainingArguments


def main(cfg):
    tokenizer = AutoTokenizer.from_pretrained(cfg["model_id"])
    tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(cfg["model_id"], torch_dtype=torch.bfloat16)

    ds = load_dataset(cfg["dataset"], split="train")
    ds = ds.map(
        lambda b: tokenizer([str(m) for m in b["messages"]], truncation=True, max_length=cfg["max_seq_length"]),
        batched=True,
        remove_columns=ds.column_names,
    )
    args = TrainingArguments(**cfg["training"])
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=ds,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )
    trainer.train()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    cli = parser.parse_args()
    with open(cli.config) as f:
        main(yaml.safe_load(f))
