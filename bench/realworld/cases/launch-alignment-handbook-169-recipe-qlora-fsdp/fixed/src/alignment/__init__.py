from .configs import DataArguments, H4ArgumentParser, ModelArguments, SFTConfig
from .model_utils import get_kbit_device_map, get_peft_config, get_quantization_config, get_tokenizer
