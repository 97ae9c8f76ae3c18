from functools import partial
from os import environ

from torch import bfloat16, save
from torch import device as torch_device
from torch.distributed import barrier, destroy_process_group, init_process_group
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch.multiprocessing import Event, Process, Value
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaForCausalLM

model_id = "codellama/CodeLlama-7b-Instruct-hf"
output_dir = "out"
file_name = "sharded"
world_size = 4
port = 9999


def load_and_save(rank, model, auto_wrap_policy, event, counter):
    environ["MASTER_ADDR"] = "localhost"
    environ["MASTER_PORT"] = str(port)
    init_process_group("nccl", rank=rank, world_size=world_size)
    print(f"wrapping in rank {rank}")
    fsdp_model = FSDP(model, auto_wrap_policy=auto_wrap_policy, device_id=torch_device(f"cuda:{rank}"))
    with counter.get_lock():
        counter.value += 1
    if rank == 0:
        config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        with FSDP.state_dict_type(fsdp_model, StateDictType.FULL_STATE_DICT, config):
            state = fsdp_model.state_dict()
        save(state, f"{output_dir}/{file_name}.pt")
        event.set()
    else:
        event.wait()
    barrier()
    destroy_process_group()


if __name__ == "__main__":
    model = LlamaForCausalLM.from_pretrained(model_id, torch_dtype=bfloat16)
    policy = partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    done, counter = Event(), Value("i", 0)
    procs = [Process(target=load_and_save, args=(r, model, policy, done, counter)) for r in range(world_size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
