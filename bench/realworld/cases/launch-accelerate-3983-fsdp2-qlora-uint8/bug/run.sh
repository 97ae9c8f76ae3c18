#!/bin/bash
accelerate launch --config_file fsdp2.yaml sft_qlora.py \
    --model_name_or_path Qwen/Qwen2.5-7B \
    --dataset_name trl-lib/Capybara \
    --dtype bfloat16 \
    --load_in_4bit \
    --use_peft --lora_r 16 --lora_alpha 32 --lora_target_modules all-linear \
    --per_device_train_batch_size 2 \
    --gradient_checkpointing \
    --bf16 \
    --output_dir Qwen2.5-7B-qlora-fsdp2
