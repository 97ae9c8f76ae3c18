"""The audit's memory lines against real tensors: AdamW state and step counters of a real optimizer
after a real step, bnb's real 4-bit quant_state, and the activation peak of a real training step.

The real side runs on CPU: FSDP1/FSDP2 under a fake process group at the audited world size (this
process plays one rank; collectives move no data, so only the sizes are meaningful), bitsandbytes'
CPU quantization, and torch's own MemTracker around a forward+backward.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("transformers")

from fsdplint.audit import run_audit, spec_from_dict  # noqa: E402
from fsdplint.audit.examples import spec, tiny  # noqa: E402
from fsdplint.audit.plan_fsdp2 import fake_process_group  # noqa: E402

WORLD = 3  # uneven: 8 LoRA rows split 3/3/2, 64 rows 22/22/20


def real_model(arch="llama", dtype=torch.float32, lora=True, **overrides):
    import peft
    import transformers
    from transformers import AutoConfig

    cfg = tiny(arch, **overrides)
    model_type, archs = cfg.pop("model_type"), cfg.pop("architectures")
    cfg.pop("torch_dtype")
    torch.manual_seed(0)
    model = getattr(transformers, archs[0])._from_config(AutoConfig.for_model(model_type, **cfg), dtype=dtype)
    if lora:
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    return model


def one_step(model):
    """Forward, backward and AdamW step; returns the optimizer with its real state."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params)
    ids = torch.randint(0, 256, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    return opt


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def state_bytes(opt, key):
    return sum(local(s[key]).numel() * local(s[key]).element_size() for s in opt.state.values())


def sharded_fsdp2(model):
    from torch.distributed.fsdp import fully_shard

    for layer in model.get_base_model().model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def wrapped_fsdp1(model, use_orig_params):
    from peft.utils.other import fsdp_auto_wrap_policy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    os.environ["FSDP_TRANSFORMER_CLS_TO_WRAP"] = "LlamaDecoderLayer"
    try:
        policy = fsdp_auto_wrap_policy(model)
    finally:
        del os.environ["FSDP_TRANSFORMER_CLS_TO_WRAP"]
    return FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cpu"), use_orig_params=use_orig_params)


def rank_column(result, attr, rank):
    return sum(getattr(u, attr)[rank] for u in result.plan.units)


@pytest.mark.parametrize("version,use_orig,rank", [(2, False, WORLD - 1), (1, False, 0), (1, True, WORLD - 1)])
def test_adamw_state_and_step_counters_equal_a_real_optimizer_step(version, use_orig, rank):
    fsdp = {"version": version, "world_size": WORLD}
    if version == 1:
        fsdp.update(auto_wrap_policy="peft", use_orig_params=use_orig)
    result = run_audit(spec_from_dict(spec(lora={"r": 8, "target_modules": ["q_proj", "v_proj"]}, fsdp=fsdp,
                                           dtype="float32"), filename="x.json"))
    fake_process_group(WORLD, rank)
    try:
        model = real_model()
        model = sharded_fsdp2(model) if version == 2 else wrapped_fsdp1(model, use_orig)
        opt = one_step(model)
    finally:
        fake_process_group(WORLD, 0)
    steps = [s["step"] for s in opt.state.values()]
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" and t.numel() == 1 for t in steps)
    assert 4 * rank_column(result, "trainable_tensors", rank) == 4 * len(steps)
    adam = state_bytes(opt, "exp_avg") + state_bytes(opt, "exp_avg_sq")
    assert 2 * rank_column(result, "trainable_bytes", rank) == adam
    if rank == result.memory.rank:
        line = result.memory.line("AdamW step counters")
        assert line.bytes == 4 * len(steps) and not line.on_device
        assert result.memory.total == sum(ln.bytes for ln in result.memory.lines if ln.label != line.label)


def test_fused_adamw_puts_the_step_counters_in_the_gpu_total():
    plain = run_audit(spec_from_dict(spec(), filename="x.json")).memory
    fused = run_audit(spec_from_dict(spec(training={"adamw_fused": True}), filename="x.json")).memory
    line = fused.line("AdamW step counters")
    assert line.on_device and fused.total == plain.total + line.bytes


def real_quant_state_bytes(model) -> int:
    import bitsandbytes as bnb

    total = 0
    for mod in model.modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            state, seen = mod.weight.quant_state, set()
            while state is not None:
                for t in (state.absmax, state.code, state.offset):
                    if isinstance(t, torch.Tensor) and id(t) not in seen:
                        seen.add(id(t))
                        total += t.numel() * t.element_size()
                state = state.state2
    return total


@pytest.mark.parametrize("double_quant,blocksize_storage", [(False, "bfloat16"), (True, "uint8")])
def test_quant_state_line_equals_bnb_real_cpu_quantization(double_quant, blocksize_storage):
    pytest.importorskip("bitsandbytes")
    from transformers import BitsAndBytesConfig

    quant = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": double_quant,
             "bnb_4bit_quant_storage": blocksize_storage, "bnb_4bit_compute_dtype": "bfloat16"}
    result = run_audit(spec_from_dict(spec(quantization=quant, fsdp={"ignored_params": "4bit"}, dtype="bfloat16"),
                                      filename="x.json"))
    # The same base model with real weights: transformers' quantizer picks the modules (as loading
    # does), bitsandbytes quantizes each weight on the CPU.
    import bitsandbytes as bnb
    from transformers.quantizers import AutoHfQuantizer

    model = real_model(dtype=torch.bfloat16, lora=False)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    storage = getattr(torch, blocksize_storage)
    cfg = BitsAndBytesConfig(**dict(quant, bnb_4bit_quant_storage=storage, bnb_4bit_compute_dtype=torch.bfloat16))
    AutoHfQuantizer.from_config(cfg).preprocess_model(model, device_map={"": "cpu"}, dtype=torch.bfloat16)
    for name, mod in model.named_modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            mod.weight = bnb.nn.Params4bit(weights[name + ".weight"], requires_grad=False, quant_type="nf4",
                                           compress_statistics=double_quant, quant_storage=storage,
                                           module=mod).to("cpu")
    real = real_quant_state_bytes(model)
    assert real > 0
    assert result.memory.line("4-bit quant_state").bytes == real
    # Replicated: every rank holds all of it, so it is in the total of every rank.
    assert all(t >= real for t in result.memory.per_rank_totals)


def measured_activation_peak(model, seq_len, micro_batch, checkpointing) -> int:
    """torch's MemTracker around a real CPU forward+backward: the peak minus parameters,
    buffers and parameter gradients at that moment."""
    from torch.distributed._tools.mem_tracker import MemTracker

    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(0, 256, (micro_batch, seq_len))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    snap = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    skip = {"Parameter", "Buffer", "Gradient"}
    return sum(v for k, v in snap.items() if k != "Total" and getattr(k, "value", k) not in skip)


@pytest.mark.parametrize("arch,dtype,checkpointing", [
    ("llama", "float32", True), ("qwen2", "bfloat16", False), ("mixtral", "bfloat16", True),
])
def test_activation_estimate_is_within_10_percent_of_a_real_step(arch, dtype, checkpointing):
    # Enough tokens that activations dwarf the parameter gradients, whose timing MemTracker's peak
    # snapshot mixes in (the estimate leaves gradients to their own line).
    seq_len, micro_batch = 256, 2
    s = spec(arch, lora=False, dtype=dtype,
             training={"seq_len": seq_len, "micro_batch": micro_batch, "activation_checkpointing": checkpointing})
    result = run_audit(spec_from_dict(s, filename="x.json"))
    act = result.memory.activations
    assert act is not None and act.checkpointing == checkpointing
    real = measured_activation_peak(real_model(arch, getattr(torch, dtype), lora=False), seq_len, micro_batch,
                                    checkpointing)
    assert act.bytes == pytest.approx(real, rel=0.10)
    line = result.memory.line("activations")
    assert line.bytes == act.bytes and f"{micro_batch} x {seq_len}" in line.how
    # Checkpointing keeps less than the full forward.
    other = act.other.bytes
    assert (act.bytes < other) if checkpointing else (act.bytes > other)


def test_activations_decide_fsdp017(tmp_path):
    import json

    from click.testing import CliRunner

    from fsdplint.audit.cli import model_command as main

    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec(gpu_memory="2MiB")))
    runner = CliRunner()
    fits = runner.invoke(main, [str(path), "--output-format", "json"])
    assert fits.exit_code == 0, fits.output
    over = runner.invoke(main, [str(path), "--seq-len", "2048", "--micro-batch", "2",
                                "--output-format", "json"])
    report = json.loads(over.output)
    (f,) = [f for f in report["findings"] if f["code"] == "FSDP017"]
    assert "with activations for micro-batch 2 x seq 2048" in f["message"]
    assert "activation checkpointing" in f["message"]  # suggested, since it is off
    act = [ln for ln in report["memory"]["lines"] if ln["label"].startswith("activations")]
    assert act and report["memory"]["total_bytes"] > 2 * 2**20
    terms = report["memory"]["activations"]
    assert (terms["seq_len"], terms["micro_batch"], terms["activation_checkpointing"]) == (2048, 2, False)
    assert terms["bytes"] == act[0]["bytes"] > terms["other_checkpointing_bytes"]
    with_ac = runner.invoke(main, [str(path), "--seq-len", "2048", "--micro-batch", "2",
                                   "--activation-checkpointing", "--output-format", "json"])
    ac_total = json.loads(with_ac.output)["memory"]["total_bytes"]
    assert ac_total < report["memory"]["total_bytes"]


def test_bad_training_section_is_one_line_exit_2(tmp_path):
    import json

    from click.testing import CliRunner

    from fsdplint.audit.cli import model_command

    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec(training={"seq_len": "long"})))
    out = CliRunner().invoke(model_command, [str(path)])
    assert out.exit_code == 2
    assert "training.seq_len: expected an integer >= 1, got 'long'" in out.output
    assert "Traceback" not in out.output


@pytest.mark.parametrize("extra", [
    {"fsdp": {"version": 1, "world_size": 3, "use_orig_params": True, "auto_wrap_policy": "peft"}},
    {"fsdp": {"version": 1, "world_size": 2, "auto_wrap_policy": "peft"}, "dtype": "bfloat16",
     "quantization": {"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"}},
])
def test_fsdp1_plan_is_executed_and_matches_the_real_flat_parameters(extra):
    fsdp = extra.pop("fsdp")
    result = run_audit(spec_from_dict(spec(fsdp=fsdp, **extra), filename="x.json"))
    assert result.plan.executed and result.plan.mismatch is None
    assert any("FSDP1 plan executed" in n for n in result.notes)


def test_4bit_qlora_activation_estimate_equals_a_real_bnb_step():
    # The meta stand-in for bnb's 4-bit matmul against bnb's real CPU kernels, both counted by the
    # same storage tracker (torch's MemTracker cannot hook the frozen base weights).
    pytest.importorskip("bitsandbytes")
    import bitsandbytes as bnb
    import peft
    from transformers import BitsAndBytesConfig
    from transformers.quantizers import AutoHfQuantizer

    from fsdplint.audit.activations import trace_step

    quant = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "bfloat16",
             "bnb_4bit_quant_storage": "bfloat16"}
    s = spec(quantization=quant, dtype="bfloat16", fsdp={"ignored_params": "4bit"},
             training={"seq_len": 128, "micro_batch": 2})
    est = run_audit(spec_from_dict(s, filename="x.json")).memory.activations
    model = real_model(dtype=torch.bfloat16, lora=False)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = BitsAndBytesConfig(**dict(quant, bnb_4bit_quant_storage=torch.bfloat16,
                                    bnb_4bit_compute_dtype=torch.bfloat16))
    quantizer = AutoHfQuantizer.from_config(cfg)
    quantizer.preprocess_model(model, device_map={"": "cpu"}, dtype=torch.bfloat16)
    for name, mod in model.named_modules():
        if isinstance(mod, bnb.nn.Linear4bit):
            mod.weight = bnb.nn.Params4bit(weights[name + ".weight"], requires_grad=False, quant_type="nf4",
                                           quant_storage=torch.bfloat16, module=mod).to("cpu")
    quantizer.postprocess_model(model)
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    model.train()
    ids = torch.randint(0, 256, (2, 128))

    def run(trace):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()

    trace, grads = trace_step(run, grads_of=model)
    assert est.bytes == pytest.approx(trace.peak(exclude=grads), rel=0.10)
