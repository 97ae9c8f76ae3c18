#!/bin/bash
# SageMaker entry point
accelerate launch --config_file configs/accelerate_fsdp.yaml train.py --config configs/train.yaml
