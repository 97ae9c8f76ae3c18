#!/bin/bash
accelerate launch \
  --mixed_precision=bf16 \
  --machine_rank=${RANK} \
  --main_process_ip=${MASTER_ADDR} \
  --main_process_port=${MASTER_PORT} \
  --num_machines=${WORLD_SIZE} \
  --num_processes=$((WORLD_SIZE*8)) \
  --use_fsdp \
  train_dreambooth_diffusers.py \
  --config config/train_imagenet.yaml
