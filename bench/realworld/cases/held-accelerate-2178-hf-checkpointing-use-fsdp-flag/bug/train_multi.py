# Train using accelerate across 2 gpus
from transformers import AutoModelForCausalLM, TrainingArguments
from datasets import load_dataset
from trl import SFTTrainer

model_save_dir = "temp/models"
dataset = load_dataset("imdb", split="train")

model = AutoModelForCausalLM.from_pretrained("facebook/opt-350m")

# model.gradient_checkpointing_enable()

training_args = TrainingArguments(
    gradient_checkpointing=True,
    output_dir=model_save_dir,
)

trainer = SFTTrainer(
    model,
    args=training_args,
    train_dataset=dataset,
    dataset_text_field="text",
    max_seq_length=512,
)

trainer.train()
