import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

from tabula_trainer import TabulaTrainer


class Tabula:
    def __init__(self, llm="distilgpt2", experiment_dir="trainer_tabula", epochs=100, batch_size=8):
        self.llm = llm
        self.tokenizer = AutoTokenizer.from_pretrained(llm)
        self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(llm)
        self.experiment_dir = experiment_dir
        self.epochs = epochs
        self.batch_size = batch_size

    def fit(self, dataset, data_collator):
        training_args = TrainingArguments(
            self.experiment_dir,
            num_train_epochs=self.epochs,
            per_device_train_batch_size=self.batch_size,
            fsdp="full_shard",
            save_strategy="no",
        )
        trainer = TabulaTrainer(
            self.model,
            training_args,
            train_dataset=dataset,
            tokenizer=self.tokenizer,
            data_collator=data_collator,
        )
        trainer.train()
        return trainer

    def sample(self, n_samples, start_tokens, max_length=100, device="cuda"):
        self.model.to(device)
        start = torch.tensor(self.tokenizer(start_tokens)["input_ids"], device=device).unsqueeze(0)
        out = self.model.generate(
            input_ids=start.repeat(n_samples, 1),
            max_length=max_length,
            do_sample=True,
            temperature=0.7,
            pad_token_id=50256,
        )
        return self.tokenizer.batch_decode(out)
