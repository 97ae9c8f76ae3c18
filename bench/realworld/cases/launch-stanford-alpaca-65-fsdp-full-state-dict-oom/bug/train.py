import json
from dataclasses import dataclass, field
from typing import Optional

import torch
import transformers
from torch.utils.data import Dataset
from transformers import Trainer


@dataclass
class ModelArguments:
    model_name_or_path: Optional[str] = field(default="facebook/opt-125m")


@dataclass
class DataArguments:
    data_path: str = field(default=None)


@dataclass
class TrainingArguments(transformers.TrainingArguments):
    cache_dir: Optional[str] = field(default=None)
    optim: str = field(default="adamw_torch")
    model_max_length: int = field(default=512)


def safe_save_model_for_hf_trainer(trainer: transformers.Trainer, output_dir: str):
    """Collects the state dict and dump to disk."""
    state_dict = trainer.model.state_dict()
    if trainer.args.should_save:
        cpu_state_dict = {key: value.cpu() for key, value in state_dict.items()}
        del state_dict
        trainer._save(output_dir, state_dict=cpu_state_dict)  # noqa


class SupervisedDataset(Dataset):
    def __init__(self, data_path, tokenizer):
        with open(data_path) as f:
            items = json.load(f)
        self.examples = [tokenizer(i["instruction"] + i["output"], truncation=True, max_length=512, return_tensors="pt") for i in items]

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, i):
        ids = self.examples[i]["input_ids"][0]
        return dict(input_ids=ids, labels=ids)


def train():
    parser = transformers.HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    model = transformers.AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, cache_dir=training_args.cache_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_args.model_name_or_path, model_max_length=training_args.model_max_length, padding_side="right", use_fast=False)
    tokenizer.pad_token = tokenizer.unk_token
    trainer = Trainer(model=model, tokenizer=tokenizer, args=training_args, train_dataset=SupervisedDataset(data_args.data_path, tokenizer))
    trainer.train()
    trainer.save_state()
    safe_save_model_for_hf_trainer(trainer=trainer, output_dir=training_args.output_dir)


if __name__ == "__main__":
    train()
