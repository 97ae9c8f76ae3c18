import math

import torch
from accelerate import Accelerator
from datasets import load_dataset
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, get_scheduler


def main():
    accelerator = Accelerator(gradient_accumulation_steps=4)
    model_id = "google/flan-t5-large"
    tokenizer = AutoTokenizer.from_pretrained(model_id)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_id)

    raw = load_dataset("samsum")
    def preprocess(b):
        inputs = tokenizer(b["dialogue"], max_length=512, truncation=True)
        inputs["labels"] = tokenizer(text_target=b["summary"], max_length=128, truncation=True)["input_ids"]
        return inputs
    tokenized = raw.map(preprocess, batched=True, remove_columns=raw["train"].column_names)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    train_dataloader = DataLoader(tokenized["train"], shuffle=True, batch_size=8, collate_fn=collator)
    val_dataloader = DataLoader(tokenized["validation"], batch_size=8, collate_fn=collator)

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    num_train_epochs = 3
    max_training_steps = num_train_epochs * math.ceil(len(train_dataloader) / 4)
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0, num_training_steps=max_training_steps)

    model, optimizer, train_dataloader, val_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, val_dataloader, lr_scheduler
    )

    progress_bar = tqdm(range(max_training_steps), disable=not accelerator.is_local_main_process)
    for epoch in range(num_train_epochs):
        model.train()
        total = 0.0
        for batch in train_dataloader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            total += loss.detach().float()
            progress_bar.update(1)
        accelerator.print(f"epoch {epoch}: train loss {total / len(train_dataloader)}")


if __name__ == "__main__":
    main()
