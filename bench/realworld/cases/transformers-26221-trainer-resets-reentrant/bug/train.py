from datasets import load_dataset
from peft import LoraConfig, TaskType, get_peft_model
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

MODEL_ID = "roberta-base"
cp_enabled = True

tokenizer = AutoTokenizer.from_pretrained(MODEL_ID)
model = AutoModelForSequenceClassification.from_pretrained(MODEL_ID, num_labels=2)
model = get_peft_model(model, LoraConfig(task_type=TaskType.SEQ_CLS, r=8, lora_alpha=16, lora_dropout=0.1))
if cp_enabled:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

dataset = load_dataset("glue", "sst2").map(lambda b: tokenizer(b["sentence"], truncation=True), batched=True)

training_args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=16,
    num_train_epochs=1,
    gradient_checkpointing=cp_enabled,
)
trainer = Trainer(model=model, args=training_args, train_dataset=dataset["train"], tokenizer=tokenizer)
trainer.train()
