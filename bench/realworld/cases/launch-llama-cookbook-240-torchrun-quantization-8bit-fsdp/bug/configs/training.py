from dataclasses import dataclass


@dataclass
class train_config:
    model_name: str = "PATH/to/LLAMA/7B"
    enable_fsdp: bool = False
    low_cpu_fsdp: bool = False
    run_validation: bool = True
    batch_size_training: int = 4
    num_epochs: int = 3
    lr: float = 1e-4
    use_peft: bool = False
    peft_method: str = "lora"
    output_dir: str = "PATH/to/save/PEFT/model"
    quantization: bool = False
    one_gpu: bool = False
    save_model: bool = True
