from dataclasses import dataclass, field
from typing import Optional

from datasets import load_dataset
from lm_eval import evaluator
from lm_eval_adaptor import LMEvalAdaptor
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
    model_name_or_path: str = field(default="huggyllama/llama-7b")


@dataclass
class DataArguments:
    dataset_name: Optional[str] = field(default=None)
    dataset_config_name: Optional[str] = field(default=None)
    tasks: str = field(default="hellaswag")


def main():
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    # train only a couple of layers: torch 2.1 allows mixed requires_grad with use_orig_params=True
    for n, p in model.named_parameters():
        if not n.startswith("model.layers.31."):
            p.requires_grad = False
    training_args.ddp_find_unused_parameters = False
    training_args.fsdp_config["use_orig_params"] = True

    raw = load_dataset(data_args.dataset_name, data_args.dataset_config_name)
    tok = raw.map(lambda b: tokenizer(b["text"], truncation=True, max_length=1024), batched=True, remove_columns=["text"])
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=tok["train"],
        eval_dataset=tok["validation"],
        tokenizer=tokenizer,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )
    train_result = trainer.train()
    trainer.log_metrics("train", train_result.metrics)

    # evaluate the trained model with lm-eval, through the reference taken before Trainer wrapped it
    model.eval()
    lm_eval_model = LMEvalAdaptor(model, tokenizer)
    results = evaluator.simple_evaluate(
        model=lm_eval_model,
        tasks=data_args.tasks.split(","),
        batch_size=384,
        no_cache=True,
    )
    print(results["results"])


if __name__ == "__main__":
    main()
