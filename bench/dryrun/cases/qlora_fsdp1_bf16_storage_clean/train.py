# The fix of the FSDP1 QLoRA reports: bnb_4bit_quant_storage equal to the model dtype, adapters kept
# in bf16 (FSDP1 flattens one dtype per unit).
import os, functools, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
                       bnb_4bit_quant_storage=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], quantization_config=q, dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
                       autocast_adapter_dtype=False)
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
model = FSDP(model, auto_wrap_policy=policy, device_id=rank, use_orig_params=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
