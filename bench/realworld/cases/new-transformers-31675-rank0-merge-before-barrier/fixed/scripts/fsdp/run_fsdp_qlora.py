from dataclasses import dataclass, field

import torch
from datasets import load_dataset
from peft import AutoPeftModelForCausalLM, LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, TrainingArguments, set_seed
from trl import SFTTrainer
from trl.commands.cli_utils import TrlParser


@dataclass
class ScriptArguments:
    dataset_path: str = field(default=None)
    model_id: str = field(default=None)
    max_seq_len: int = field(default=512)
    merge_adapters: bool = field(default=False)


def training_function(script_args, training_args):
    train_dataset = load_dataset("json", data_files=f"{script_args.dataset_path}/train_dataset.json", split="train")
    tokenizer = AutoTokenizer.from_pretrained(script_args.model_id, use_fast=True)
    tokenizer.pad_token = tokenizer.eos_token

    torch_dtype = torch.bfloat16
    quant_storage_dtype = torch.bfloat16
    quantization_config = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_use_double_quant=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch_dtype,
        bnb_4bit_quant_storage=quant_storage_dtype,
    )
    model = AutoModelForCausalLM.from_pretrained(
        script_args.model_id,
        quantization_config=quantization_config,
        attn_implementation="sdpa",
        torch_dtype=quant_storage_dtype,
        use_cache=False if training_args.gradient_checkpointing else True,
    )
    if training_args.gradient_checkpointing:
        model.gradient_checkpointing_enable()

    peft_config = LoraConfig(
        lora_alpha=8,
        lora_dropout=0.05,
        r=16,
        bias="none",
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    trainer = SFTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        dataset_text_field="text",
        peft_config=peft_config,
        max_seq_length=script_args.max_seq_len,
        tokenizer=tokenizer,
        packing=True,
    )
    if trainer.accelerator.is_main_process:
        trainer.model.print_trainable_parameters()

    trainer.train()

    # SAVE MODEL FOR SAGEMAKER
    sagemaker_save_dir = "/opt/ml/model"
    if trainer.is_fsdp_enabled:
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model()

    if script_args.merge_adapters and training_args.distributed_state.is_main_process:
        # load the base model again in bf16, merge the adapter and write the full model (141B params)
        del model
        del trainer
        torch.cuda.empty_cache()
        model = AutoPeftModelForCausalLM.from_pretrained(
            training_args.output_dir, torch_dtype=torch.float16, low_cpu_mem_usage=True
        )
        model = model.merge_and_unload()
        print("Saving the newly created merged model to", sagemaker_save_dir)
        model.save_pretrained(sagemaker_save_dir, safe_serialization=True, max_shard_size="2GB")
        tokenizer.save_pretrained(sagemaker_save_dir)

    # every rank waits here for rank 0
    training_args.distributed_state.wait_for_everyone()


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, TrainingArguments))
    script_args, training_args = parser.parse_args_and_config()
    if training_args.gradient_checkpointing:
        training_args.gradient_checkpointing_kwargs = {"use_reentrant": True}
    set_seed(training_args.seed)
    training_function(script_args, training_args)
