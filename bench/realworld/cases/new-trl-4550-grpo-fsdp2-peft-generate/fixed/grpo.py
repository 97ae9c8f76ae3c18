from datasets import Dataset, load_dataset
from peft import LoraConfig, TaskType
from trl import GRPOConfig, GRPOTrainer


def reward_num_unique_letters(completions, **kwargs):
    """Reward completions with more unique letters."""
    contents = [completion[0]["content"] for completion in completions]
    return [float(len(set(content))) for content in contents]


dataset = load_dataset("trl-lib/ultrafeedback-prompt", split="train")
assert isinstance(dataset, Dataset)

lora_config = LoraConfig(
    r=8,
    lora_alpha=32,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
    task_type=TaskType.CAUSAL_LM,
)

training_args = GRPOConfig(
    fp16=True,
    gradient_accumulation_steps=8,
    learning_rate=5e-5,
    num_train_epochs=3,
    output_dir="grpo-qwen2-0.5b-lora-fsdp2",
    per_device_train_batch_size=4,
)
trainer = GRPOTrainer(
    model="Qwen/Qwen2-0.5B-Instruct",
    args=training_args,
    peft_config=lora_config,
    reward_funcs=reward_num_unique_letters,
    train_dataset=dataset,
)
trainer.train()
