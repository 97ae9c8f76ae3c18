#!/bin/bash
# 2 x RTX 3090
accelerate launch --config_file fsdp2.yaml grpo.py
