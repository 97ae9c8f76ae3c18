from .training import train_config
from .fsdp import fsdp_config
from .peft import lora_config
