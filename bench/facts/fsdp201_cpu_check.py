"""FSDP2 (`fully_shard`) on a bitsandbytes 4-bit Llama with LoRA, measured on CPU (2 gloo ranks): the
evidence behind FSDP201.

    python bench/facts/fsdp201_cpu_check.py                # uint8 and bfloat16 storage
    python bench/facts/fsdp201_cpu_check.py --storage uint8

A tiny Llama (written here from a config, no download) is saved, loaded back in 4 bits
(`BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=...)`) on CPU, given LoRA on q/v, and sharded
with `fully_shard` on every decoder layer and the root, without `ignored_params`. Each rank compares the
sharded model's logits with an unsharded copy's, runs backward, and reports what the 4-bit weights are after
sharding (type, `quant_state`) and after forward/backward (a DTensor again?). Prints one line per storage:
`logits equal` / `logits DIFFER by X` / `RAISES <error>`. `run()` returns the results for the test suite.
"""

from __future__ import annotations

import argparse
import ast
import os
import socket
import sys
import tempfile


def _worker(rank, world, port, model_dir, storage, out_dir):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    res = {}
    try:
        import bitsandbytes as bnb
        from peft import LoraConfig, get_peft_model
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        def load():
            q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16,
                                   bnb_4bit_quant_storage=getattr(torch, storage))
            m = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=q, device_map="cpu",
                                                     dtype=torch.bfloat16)
            torch.manual_seed(1)
            return get_peft_model(m, LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                init_lora_weights=False))

        ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
        ref = load()
        with torch.no_grad():
            want = ref(input_ids=ids).logits.float()
        model = load()
        layers = model.base_model.model.model.layers
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
        w = layers[0].self_attn.q_proj.base_layer.weight
        res["after_shard"] = f"{type(w).__name__}, quant_state={getattr(w, 'quant_state', None) is not None}"
        out = model(input_ids=ids).logits.float()
        diff = (out - want).abs().max().item()
        res["max_diff"] = diff
        res["max_logit"] = want.abs().max().item()
        out.sum().backward()
        lora = layers[0].self_attn.q_proj.lora_A["default"].weight
        res["lora_grad"] = lora.grad is not None
        w = layers[0].self_attn.q_proj.base_layer.weight
        res["after_backward"] = type(w).__name__
        res["bnb"] = bnb.__version__
    except Exception as e:  # the measurement is the error text
        res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    with open(os.path.join(out_dir, f"{rank}.txt"), "w") as f:
        f.write(repr(res))
    dist.destroy_process_group()


def _tiny_llama(path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)


def run(storages=("uint8", "bfloat16"), world: int = 2) -> dict:
    import torch
    import torch.multiprocessing as mp

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        _tiny_llama(model_dir)
        for storage in storages:
            out = os.path.join(tmp, storage)
            os.makedirs(out)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            mp.spawn(_worker, args=(world, port, model_dir, storage, out), nprocs=world, join=True)
            results[storage] = [ast.literal_eval(open(os.path.join(out, f"{r}.txt")).read()) for r in range(world)]
    return {"torch": torch.__version__, "results": results}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--storage", action="append", choices=("uint8", "bfloat16", "float16", "float32"))
    args = p.parse_args()
    res = run(tuple(args.storage or ("uint8", "bfloat16")))
    print(f"torch {res['torch']}")
    for storage, ranks in res["results"].items():
        for r, d in enumerate(ranks):
            if "error" in d:
                print(f"{storage} rank {r}: RAISES {d['error']}")
                continue
            logits = "logits equal" if d["max_diff"] == 0 else (
                f"logits differ by at most {d['max_diff']:.3g} (largest |logit| {d['max_logit']:.3g})")
            print(f"{storage} rank {r} (bitsandbytes {d['bnb']}): after fully_shard the weight is "
                  f"{d['after_shard']}; {logits}; LoRA grad {'present' if d['lora_grad'] else 'MISSING'}; "
                  f"after backward {d['after_backward']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
