#!/bin/bash
# SageMaker: 2 x p4de.24xlarge, torch_distributed (torchrun) launcher
ACCELERATE_USE_FSDP=1 FSDP_CPU_RAM_EFFICIENT_LOADING=1 torchrun \
    --nnodes 2 --nproc_per_node 8 --node_rank ${SM_NODE_RANK:-0} \
    --master_addr ${MASTER_ADDR:-algo-1} --master_port 7777 \
    scripts/fsdp/run_fsdp_qlora.py --config recipes/mixtral_8x22b_fsdp_qlora.yaml
