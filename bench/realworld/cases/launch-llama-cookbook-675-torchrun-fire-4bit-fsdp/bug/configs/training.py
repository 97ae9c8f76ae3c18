from dataclasses import dataclass


@dataclass
class train_config:
    model_name: str = "PATH/to/Model"
    enable_fsdp: bool = False
    low_cpu_fsdp: bool = False
    batch_size_training: int = 4
    num_epochs: int = 3
    lr: float = 1e-4
    use_peft: bool = False
    peft_method: str = "lora"
    output_dir: str = "PATH/to/save/PEFT/model"
    quantization: str = None  # "4bit" or "8bit"
    use_fp16: bool = False
    mixed_precision: bool = True
    save_model: bool = True
