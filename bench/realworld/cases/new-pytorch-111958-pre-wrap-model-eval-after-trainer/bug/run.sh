#!/bin/bash
torchrun --nproc_per_node 8 run_clm_eval.py \
    --model_name_or_path huggyllama/llama-7b \
    --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 \
    --do_train --do_eval \
    --bf16 \
    --per_device_train_batch_size 2 \
    --output_dir out/llama-7b-partial \
    --fsdp "full_shard auto_wrap" \
    --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer \
    --tasks "hellaswag,arc_easy"
