#!/bin/bash
# one line per node; MASTER_ADDR / NODE_RANK come from the scheduler
accelerate launch --config_file config.yaml \
    --main_process_ip $MASTER_ADDR --main_process_port 29500 --machine_rank $NODE_RANK \
    train.py --model_name_or_path mistralai/Mistral-7B-v0.1 --output_dir ./ckpt
