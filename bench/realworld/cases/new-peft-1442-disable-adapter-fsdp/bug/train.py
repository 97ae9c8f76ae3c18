"""LLM + LoRA under FSDP1; the frozen base (adapter off) gives the reference outputs."""
import functools
import os

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from peft.utils.other import fsdp_auto_wrap_policy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision
from transformers import AutoModelForCausalLM, AutoTokenizer


class Captioner(torch.nn.Module):
    def __init__(self, llm_path):
        super().__init__()
        llm = AutoModelForCausalLM.from_pretrained(llm_path, torch_dtype=torch.bfloat16)
        lora = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], lora_dropout=0.05, task_type="CAUSAL_LM")
        self.llm = get_peft_model(llm, lora)

    def forward(self, input_ids, attention_mask, labels):
        return self.llm(input_ids=input_ids, attention_mask=attention_mask, labels=labels)


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)

    model = Captioner(os.environ.get("LLM", "lmsys/vicuna-7b-v1.5"))
    tokenizer = AutoTokenizer.from_pretrained(os.environ.get("LLM", "lmsys/vicuna-7b-v1.5"))
    tokenizer.pad_token = tokenizer.unk_token

    my_model = FSDP(
        model,
        auto_wrap_policy=fsdp_auto_wrap_policy(model.llm),
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16),
        device_id=torch.cuda.current_device(),
        use_orig_params=True,
    )
    optimizer = torch.optim.AdamW([p for p in my_model.parameters() if p.requires_grad], lr=1e-4)

    batch = tokenizer(["a photo of a cat"] * 4, return_tensors="pt", padding=True).to(local_rank)
    for step in range(10):
        with torch.no_grad():
            with my_model.llm.disable_adapter():
                ref = my_model.llm(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        out = my_model(batch.input_ids, batch.attention_mask, labels=batch.input_ids)
        loss = out.loss + 0.1 * torch.nn.functional.mse_loss(out.logits, ref)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
