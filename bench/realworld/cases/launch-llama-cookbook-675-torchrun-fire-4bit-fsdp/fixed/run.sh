#!/bin/bash
#SBATCH --nodes=1
#SBATCH --gres=gpu:4
NGPU=4
MODEL=meta-llama/Meta-Llama-3-8B
torchrun --nnodes 1 --nproc_per_node $NGPU finetuning.py \
  --enable_fsdp \
  --model_name $MODEL \
  --use_peft --peft_method lora \
  --quantization 4bit \
  --batch_size_training 2 \
  --output_dir ./peft-out
