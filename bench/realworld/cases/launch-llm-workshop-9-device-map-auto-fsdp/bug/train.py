from dataclasses import dataclass, field
from typing import Optional

from datasets import load_dataset
from transformers import HfArgumentParser, TrainingArguments, set_seed
from trl import SFTTrainer

from utils import create_and_prepare_model


@dataclass
class ScriptArguments:
    model_name: Optional[str] = field(default="meta-llama/Llama-2-7b-chat-hf")
    dataset_name: Optional[str] = field(default="timdettmers/openassistant-guanaco")
    dataset_text_field: str = field(default="text")
    max_seq_len: Optional[int] = field(default=512)
    packing: Optional[bool] = field(default=False)
    lora_alpha: Optional[int] = field(default=16)
    lora_dropout: Optional[float] = field(default=0.1)
    lora_r: Optional[int] = field(default=64)
    lora_target_modules: Optional[str] = field(default="q_proj,k_proj,v_proj,o_proj,down_proj,up_proj,gate_proj")
    use_nested_quant: Optional[bool] = field(default=False)
    bnb_4bit_compute_dtype: Optional[str] = field(default="float16")
    bnb_4bit_quant_type: Optional[str] = field(default="nf4")
    use_flash_attn: Optional[bool] = field(default=False)
    use_peft_lora: Optional[bool] = field(default=False)
    use_4bit_quantization: Optional[bool] = field(default=False)
    use_8bit_quantization: Optional[bool] = field(default=False)
    use_gradient_checkpointing: Optional[bool] = field(default=False)


def main(args, training_args):
    set_seed(training_args.seed)
    model, peft_config, tokenizer = create_and_prepare_model(args)
    model.config.use_cache = False
    train_dataset = load_dataset(args.dataset_name, split="train")
    training_args.gradient_checkpointing = args.use_gradient_checkpointing
    trainer = SFTTrainer(
        model=model,
        tokenizer=tokenizer,
        args=training_args,
        train_dataset=train_dataset,
        peft_config=peft_config,
        packing=args.packing,
        dataset_text_field=args.dataset_text_field,
        max_seq_length=args.max_seq_len,
    )
    trainer.train()
    if trainer.is_fsdp_enabled:
        trainer.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model()


if __name__ == "__main__":
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    args, training_args = parser.parse_args_into_dataclasses()
    main(args, training_args)
