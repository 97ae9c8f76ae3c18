#!/bin/bash
set -ex
NPROC_PER_NODE=${NPROC_PER_NODE:-8}
MODEL=${MODEL:-meta-llama/Llama-2-13b-hf}
FSDP_CONFIG="fsdp_config.json"
OUT_DIR=./output/llama2-13b-fsdp

torchrun --nnodes 1 --nproc_per_node ${NPROC_PER_NODE} \
    training_script.py \
    --model_name_or_path ${MODEL} \
    --bf16 true \
    --output_dir ${OUT_DIR} \
    --num_train_epochs 2 \
    --per_device_train_batch_size 4 \
    --gradient_accumulation_steps 2 \
    --learning_rate 2e-5 \
    --save_strategy "epoch" \
    --fsdp "full_shard auto_wrap" \
    --fsdp_config ${FSDP_CONFIG} \
    --logging_steps 1
