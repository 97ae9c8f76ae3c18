#!/bin/bash
# 8 x A100
accelerate launch -m axolotl.cli.train lora-fsdp-70b.yaml
