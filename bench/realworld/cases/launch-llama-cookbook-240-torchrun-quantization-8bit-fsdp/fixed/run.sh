#!/bin/bash
# 4 x A10G, Code Llama 7B, PEFT + FSDP
torchrun --nnodes 1 --nproc_per_node 4 llama_finetuning.py \
    --enable_fsdp \
    --use_peft \
    --peft_method lora \
    --model_name codellama/CodeLlama-7b-hf \
    --pure_bf16 \
    --output_dir ./peft_out
