#!/bin/bash
accelerate launch --config_file fsdp.yaml train.py \
    --model_name_or_path tiiuae/falcon-40b \
    --output_dir out/falcon-40b \
    --per_device_train_batch_size 1 \
    --bf16 True \
    --num_train_epochs 1
