#!/bin/bash
# 4 x A100-40G, NVIDIA PyTorch container 23.12
torchrun --nproc_per_node 4 train.py
