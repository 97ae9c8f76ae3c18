#!/bin/bash
# 4 x A100 80GB
accelerate launch -m axolotl.cli.train lora-fsdp.yml
