#!/bin/bash
DATA=data-bin/librispeech
fairseq-train $DATA \
    --user-dir my_models \
    --task audio_pretraining \
    --arch my_encoder \
    --ddp-backend fully_sharded \
    --fp16 --checkpoint-activations \
    --encoder-layers 24 \
    --encoder-layerdrop 0.1 \
    --max-tokens 1400000 \
    --update-freq 2 \
    --lr 0.0005 --optimizer adam --lr-scheduler polynomial_decay \
    --distributed-world-size 16
