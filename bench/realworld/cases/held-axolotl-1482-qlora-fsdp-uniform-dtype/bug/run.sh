#!/bin/bash
# 2 x RTX 4090
CUDA_VISIBLE_DEVICES=1,3 accelerate launch -m axolotl.cli.train ./qlora-fsdp.yml
