import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, NewType, Optional, Tuple

import transformers
import trl
from transformers import HfArgumentParser

DataClassType = NewType("DataClassType", Any)


class H4ArgumentParser(HfArgumentParser):
    def parse(self) -> DataClassType | Tuple[DataClassType]:
        # a single YAML recipe, optionally followed by --key=value overrides
        if len(sys.argv) >= 2 and sys.argv[1].endswith(".yaml"):
            output = self.parse_yaml_file(sys.argv[1])
            # overrides from the command line are applied on top of the recipe
            for arg in sys.argv[2:]:
                key, value = arg.removeprefix("--").split("=", 1)
                for obj in output:
                    if hasattr(obj, key):
                        setattr(obj, key, type(getattr(obj, key))(value) if getattr(obj, key) is not None else value)
        else:
            output = self.parse_args_into_dataclasses()
        return output[0] if len(output) == 1 else output


@dataclass
class ModelArguments:
    model_name_or_path: Optional[str] = field(default=None)
    model_revision: str = field(default="main")
    torch_dtype: Optional[str] = field(default=None, metadata={"choices": ["auto", "bfloat16", "float16", "float32"]})
    trust_remote_code: bool = field(default=False)
    attn_implementation: Optional[str] = field(default=None)
    use_peft: bool = field(default=False)
    lora_r: Optional[int] = field(default=16)
    lora_alpha: Optional[int] = field(default=32)
    lora_dropout: Optional[float] = field(default=0.05)
    lora_target_modules: Optional[List[str]] = field(default=None)
    lora_modules_to_save: Optional[List[str]] = field(default=None)
    load_in_8bit: bool = field(default=False)
    load_in_4bit: bool = field(default=False)
    bnb_4bit_quant_type: Optional[str] = field(default="nf4")
    use_bnb_nested_quant: bool = field(default=False)
    bnb_4bit_quant_storage: Optional[str] = field(default="uint8", metadata={"help": "storage type to pack the quanitzed 4-bit prarams."})


@dataclass
class DataArguments:
    dataset_mixer: Optional[Dict[str, float]] = field(default=None)
    dataset_splits: Optional[List[str]] = field(default_factory=lambda: ["train", "test"])
    preprocessing_num_workers: Optional[int] = field(default=None)


@dataclass
class SFTConfig(trl.SFTConfig):
    hub_model_revision: Optional[str] = field(default="main")
    logging_first_step: bool = field(default=True)
