#!/bin/bash
accelerate launch --config_file fsdp_qlora.yaml dpo_mllama.py \
    --model_path meta-llama/Llama-3.2-11B-Vision-Instruct \
    --sft_adapter_path ./sft-adapter \
    --output_dir ./dpo-out
