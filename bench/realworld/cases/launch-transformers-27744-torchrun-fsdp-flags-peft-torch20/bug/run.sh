#!/bin/bash
MODEL_PATH=meta-llama/Llama-2-7b-hf
OUTPUT_DIR=checkpoints/mammoth-7b-lora
torchrun --nproc_per_node=4 --master_port=12345 train.py \
    --model_name_or_path $MODEL_PATH \
    --data_path "TIGER-Lab/MathInstruct" \
    --bf16 True \
    --output_dir $OUTPUT_DIR \
    --num_train_epochs 3 \
    --per_device_train_batch_size 2 \
    --per_device_eval_batch_size 1 \
    --gradient_accumulation_steps 8 \
    --evaluation_strategy "no" \
    --save_strategy "steps" \
    --save_steps 2000 \
    --save_total_limit 1 \
    --learning_rate 2e-5 \
    --weight_decay 0. \
    --warmup_ratio 0.03 \
    --lr_scheduler_type "cosine" \
    --logging_steps 1 \
    --fsdp "full_shard auto_wrap" \
    --fsdp_transformer_layer_cls_to_wrap 'LlamaDecoderLayer' \
    --tf32 True
