import functools, os, sys, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
from peft import LoraConfig, get_peft_model
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = AutoModelForCausalLM.from_pretrained(os.environ["MODEL"], dtype=torch.float32)
model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
# frozen base and adapters in one unit per layer: allowed with use_orig_params=True; each rank's shard
# holds elements of only some of the adapters
policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
model = FSDP(model, auto_wrap_policy=policy, device_id=torch.cuda.current_device(), use_orig_params=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.ones(2, 8, dtype=torch.long).cuda()
if "--detach-second-layer" in sys.argv:  # a loss on the first layer's output only
    out = model(input_ids=ids, output_hidden_states=True).hidden_states[1].float().pow(2).mean()
else:
    out = model(input_ids=ids, labels=ids).loss
out.backward()
opt.step()
