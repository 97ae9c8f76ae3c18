"""SFTTrainer + LoRA under the Trainer's own FSDP (FSDP1, FULL_STATE_DICT), a checkpoint every step."""
import sys

from datasets import load_dataset
from peft import LoraConfig
from trl import SFTConfig, SFTTrainer

ds = load_dataset("json", data_files="data.jsonl", split="train")
args = SFTConfig(output_dir="trainer_out", per_device_train_batch_size=1, max_steps=3, bf16=True, report_to=[],
                 save_strategy="steps", save_steps=1, max_length=16, model_init_kwargs={"dtype": "bfloat16"},
                 fsdp="full_shard auto_wrap",
                 fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})
trainer = SFTTrainer(model=sys.argv[1], args=args, train_dataset=ds,
                     peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
trainer.train()
trainer.save_model()
