#!/bin/bash
# FSDP + QLoRA on 8 x A100 80G
ACCELERATE_LOG_LEVEL=info accelerate launch \
    --config_file recipes/accelerate_configs/fsdp_qlora.yaml \
    --num_processes=8 \
    scripts/run_sft.py recipes/llama3-70b/sft/config_qlora.yaml
