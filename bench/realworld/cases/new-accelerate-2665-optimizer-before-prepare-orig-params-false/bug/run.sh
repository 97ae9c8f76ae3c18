#!/bin/bash
accelerate launch --config_file default_config.yaml train_t5.py
