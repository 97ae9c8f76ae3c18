#!/usr/bin/env python3.10

CUDA_VISIBLE_DEVICES=0,1 accelerate launch \
    --config_file ../accelerate/fsdp_config.yaml \
    ../../src/train_bash.py \
    --stage sft \
    --do_train \
    --model_name_or_path ../../model/Qwen1.5-72B-Chat-GPTQ-Int4 \
    --dataset KeeAndLau \
    --dataset_dir ../../data \
    --template qwen \
    --finetuning_type lora \
    --lora_rank 128 \
    --lora_alpha 256 \
    --lora_target all \
    --output_dir ../../saves/qwen72b-gtpq-int4/lora/sft \
    --overwrite_cache \
    --overwrite_output_dir \
    --cutoff_len 512 \
    --per_device_train_batch_size 1 \
    --per_device_eval_batch_size 2 \
    --gradient_accumulation_steps 2 \
    --lr_scheduler_type cosine \
    --repetition_penalty 1.05 \
    --top_p 0.6 \
    --top_k 0 \
    --temperature 1.15 \
    --warmup_steps 300 \
    --logging_steps 10 \
    --save_steps 100 \
    --learning_rate 5e-5 \
    --num_train_epochs 2.0 \
    --quantization_bit 4 \
    --plot_loss \
    --fp16
