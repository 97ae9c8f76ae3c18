from .training import train_config
from .fsdp import fsdp_config
