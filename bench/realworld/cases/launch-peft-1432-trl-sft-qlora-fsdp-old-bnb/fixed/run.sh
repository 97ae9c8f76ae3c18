#!/bin/bash
MODEL=/nas/models_hf/Llama-2-7b-hf
OUT=/nas/ft/sft-llama2-qlora

accelerate launch --config_file fsdp.yaml sft.py \
    --model_name_or_path=$MODEL \
    --report_to="none" \
    --learning_rate=1.41e-5 \
    --per_device_train_batch_size=8 \
    --gradient_accumulation_steps=16 \
    --output_dir=$OUT \
    --logging_steps=1 \
    --num_train_epochs=3 \
    --max_steps=-1 \
    --gradient_checkpointing \
    --torch_dtype=bfloat16 \
    --bf16 \
    --use_peft \
    --lora_r=64 \
    --lora_alpha=16 \
    --load_in_4bit
