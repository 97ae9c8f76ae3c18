import argparse

import torch
from datasets import load_dataset
from peft import PeftModel
from transformers import AutoProcessor, BitsAndBytesConfig, MllamaForConditionalGeneration
from trl import DPOConfig, DPOTrainer


def main(args):
    bnb_config = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype="bfloat16",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_quant_storage="bfloat16",
    )
    model = MllamaForConditionalGeneration.from_pretrained(
        args.model_path, quantization_config=bnb_config, low_cpu_mem_usage=True, torch_dtype=torch.bfloat16
    )
    # the SFT adapter, trained further by DPO
    model = PeftModel.from_pretrained(
        model, args.sft_adapter_path, is_trainable=True, autocast_adapter_dtype=False,
        low_cpu_mem_usage=True, adapter_name="dpo_adapter",
    )
    # the same adapter loaded a second time, frozen: the reference model (TRL docs, "reference model
    # considerations with PEFT")
    model.load_adapter(args.sft_adapter_path, is_trainable=False, autocast_adapter_dtype=False, adapter_name="reference")

    processor = AutoProcessor.from_pretrained(args.model_path)
    train_dataset = load_dataset("HuggingFaceH4/rlaif-v_formatted", split="train")

    training_args = DPOConfig(
        output_dir=args.output_dir,
        model_adapter_name="dpo_adapter",
        ref_adapter_name="reference",
        per_device_train_batch_size=1,
        gradient_accumulation_steps=8,
        bf16=True,
        gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )
    trainer = DPOTrainer(model=model, ref_model=None, args=training_args, train_dataset=train_dataset, processing_class=processor)
    trainer.train()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--model_path", required=True)
    p.add_argument("--sft_adapter_path", required=True)
    p.add_argument("--output_dir", default="dpo-out")
    main(p.parse_args())
