#!/bin/bash
# 2 GPUs, as typed in the report
accelerate launch --use_fsdp -m train_multi
