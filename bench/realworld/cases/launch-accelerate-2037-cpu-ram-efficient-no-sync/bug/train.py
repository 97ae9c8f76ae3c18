from dataclasses import dataclass, field

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    model_name_or_path: str = field(default="tiiuae/falcon-7b")


def main():
    parser = HfArgumentParser((ModelArguments, TrainingArguments))
    model_args, training_args = parser.parse_args_into_dataclasses()
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    ds = load_dataset("tatsu-lab/alpaca", split="train")
    ds = ds.map(lambda b: tokenizer(b["text"], truncation=True, max_length=1024), batched=True, remove_columns=ds.column_names)
    trainer = Trainer(model=model, args=training_args, train_dataset=ds, tokenizer=tokenizer)
    trainer.train()
    trainer.save_model()


if __name__ == "__main__":
    main()
