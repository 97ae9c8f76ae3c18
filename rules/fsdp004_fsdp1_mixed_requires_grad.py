from fsdplint.analysis import UNKNOWN
from fsdplint.analysis.framework import declare_hint, framework_wraps, trainable_lora_before
from fsdplint.analysis.lightning import lightning_fsdp
from fsdplint.analysis.lightning import use_orig_params as lightning_orig_params
from fsdplint.apis import api_of
from fsdplint.audit.examples import spec
from fsdplint.facts import MEASURED, Fact
from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import Replace, unsafe
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid

# FullyShardedDataParallel(module, process_group, sharding_strategy, cpu_offload, auto_wrap_policy, ...)
_POLICY_POSITION = 4
_ACCELERATE_FSDP1 = (
    "distributed_type: FSDP\n"
    "fsdp_config:\n"
    "  fsdp_version: 1\n"
    "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
    "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n"
    "  fsdp_use_orig_params: {orig}\n"
)
# A model class that freezes one of its own submodules when it is built (no PEFT involved).
_SELF_FROZEN = """
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

class Layer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.router = nn.Linear(dim, 8)
        self.proj = nn.Linear(dim, dim)
        self.router.requires_grad_(False)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Layer(512) for _ in range(6))

net = Net()
net = FSDP(net, auto_wrap_policy=ModuleWrapPolicy({Layer}))
"""


class Fsdp1MixedRequiresGrad(Rule):
    code = "FSDP004"
    name = "fsdp1-mixed-requires-grad"
    severity = Severity.ERROR
    summary = (
        "FSDP1 unit mixing frozen base and trainable LoRA params with use_orig_params=False "
        "(torch 2.0: even with True)"
    )
    sides = "SA"
    fix = Applicability.UNSAFE
    versions = {"torch": ">=2.0"}
    doc = """
    ## What it does
    Simulates the FSDP1 auto-wrap policy and checks that every unit's parameters are uniformly frozen or
    uniformly trainable when `use_orig_params=False`. In scripts, also finds Lightning's `FSDPStrategy`
    (the `strategy=` of `Fabric` / `Trainer`) over a LoRA model (peft, or loralib's
    `mark_only_lora_as_trainable`) whose `auto_wrap_policy` wraps whole blocks: Lightning >= 2.1 passes
    `use_orig_params=True` on torch >= 2.0 (2.0 left FSDP's `False`), so it is reported on torch 2.0, with
    `use_orig_params=False`, or on Lightning 2.0 (see `fsdplint/analysis/lightning.py`).
    Where a framework does the wrap (`accelerator.prepare`, the HF Trainer's `train()`, trl's trainers given
    `peft_config=`, which inject LoRA themselves), judges the units with the job's FSDP plan (an accelerate
    config or environment, `TrainingArguments(fsdp=..., fsdp_config=...)`, `--fsdp` flags): the framework's
    own `use_orig_params` default when the plan leaves it out (accelerate: False; the Trainer: False before
    transformers 4.36, True from it) and the Trainer's switch to peft's policy for a PEFT model
    (transformers >= 4.39). A value that decides it but cannot be read makes the finding a warning that
    says what to declare (`fsdplint/analysis/framework.py`); so does a transformers release nobody declares
    (no pin, lock or install), since the job may run one on either side of 4.36 / 4.39 — unless a known
    library bounds it (trl >= 0.11 requires transformers >= 4.40). The Trainer's `fsdp_config={"xla": true}`
    (torch_xla's FSDP on TPU) is not torch FSDP1 and is not judged.
    Without PEFT, finds a model class of the script whose `__init__` freezes one of its own submodules
    (`self.k.requires_grad_(False)`, or a loop over `self.k.parameters()`) next to trainable ones, wrapped
    with no policy or a block policy that does not give the frozen submodule a unit of its own.

    ## Why is this bad?
    One FSDP1 unit is one `FlatParameter` with a single `requires_grad`. A decoder layer holding the frozen
    base weights and the trainable LoRA matrices cannot be flattened: torch raises `ValueError: <module>
    has both parameters with requires_grad=True and False. FSDP does not support wrapping such modules
    when use_orig_params=False.` (torch >= 2.1; torch 2.0 refuses even with `use_orig_params=True`).
    With `use_orig_params=True` it works, but gradient memory is that of the whole unit.

    ## Example
    ```python
    model = get_peft_model(model, LoraConfig(target_modules=["q_proj", "v_proj"]))
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}))
    ```

    ## Use instead
    ```python
    from peft.utils.other import fsdp_auto_wrap_policy
    model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=False)
    ```
    peft's policy wraps each trainable LoRA leaf in its own unit.

    ## Fix safety
    Unsafe: changing the wrap policy changes the sharding layout and checkpoint structure.

    ## Versions
    torch 2.0: no escape (pytorch#100945); torch >= 2.1 allows mixing with `use_orig_params=True`
    (pytorch#98221). The Trainer: `use_orig_params` True by default from transformers 4.36.0 (4.35.2:
    False); peft's policy for a PEFT model from 4.39.0 (4.38.2: the config's policy). Declare
    `transformers>=4.39` (or the release the job runs) to decide a framework wrap.

    ## References
    - pytorch#100945, pytorch#98221, pytorch#104690
    - peft#1702; peft `fsdp_auto_wrap_policy` (peft/utils/other.py)
    - lit-llama#361, litgpt#1392; Lightning fabric/strategies/fsdp.py (`use_orig_params` default)
    """
    facts = (
        Fact("FSDP1 with use_orig_params=False refuses a unit that mixes frozen and trainable parameters",
             "torch 2.13.0, peft 0.21.2", MEASURED,
             "2 gloo ranks, LoRA on q/v: one unit raises 'Must flatten tensors with uniform `requires_grad` when "
             "`use_orig_params=False`'; one unit per block raises 'base_model.model.layers.0 has both parameters "
             "with requires_grad=True and False'; peft's layout (LoRA leaves their own units) wraps",
             "python bench/facts/fsdp402_nested_save_check.py"),
    )

    VALID = [
        # The model freezes part of each layer itself: fine with use_orig_params=True, or when the policy also
        # gives the frozen Linear its own unit, or when a class freezes all of its own parameters.
        Valid(_SELF_FROZEN.replace("ModuleWrapPolicy({Layer}))", "ModuleWrapPolicy({Layer}), use_orig_params=True)"),
              target={"torch": "2.4"}),
        Valid(_SELF_FROZEN.replace("ModuleWrapPolicy({Layer})", "ModuleWrapPolicy({Layer, nn.Linear})"),
              target={"torch": "2.4"}),
        Valid(_SELF_FROZEN.replace("net = Net()\n", "net = Net()\nnet.requires_grad_(True)\n"), target={"torch": "2.4"}),
        Valid(_SELF_FROZEN.replace("self.router.requires_grad_(False)",
                                   "for p in self.parameters():\n            p.requires_grad = False"),
              target={"torch": "2.4"}),
        # peft's own policy puts every trainable LoRA leaf in its own unit (peft docs, accelerate/fsdp.md).
        """
        from peft import get_peft_model
        from peft.utils.other import fsdp_auto_wrap_policy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = get_peft_model(model, lora_config)
        model = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), use_orig_params=False)
        """,
        # A lambda policy over trainable leaves does the same by hand.
        """
        import functools
        import torch.distributed.fsdp as f
        from peft import get_peft_model as add_lora
        from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy

        def trainable_leaf(m):
            return not list(m.children()) and getattr(m, "weight", None) is not None and m.weight.requires_grad

        model = add_lora(model, cfg)
        leaves = functools.partial(lambda_auto_wrap_policy, lambda_fn=trainable_leaf)
        layers = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
        policy = functools.partial(_or_policy, policies=[leaves, layers])
        model = f.FullyShardedDataParallel(model, auto_wrap_policy=policy)
        """,
        """
        from peft import get_peft_model
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        model = get_peft_model(model, lora_config)
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}), use_orig_params=True)
        """,
        # Full fine-tuning: every parameter trains.
        """
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}))
        """,
        # An adapter loaded for inference is frozen like the base: requires_grad is uniform.
        """
        from peft import PeftModel
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        model = PeftModel.from_pretrained(base, "out/adapter")
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}))
        """,
        Valid(
            """
            from peft import get_peft_model
            from peft.utils.other import fsdp_auto_wrap_policy as peft_policy
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = get_peft_model(model, lora_config)
            policy = peft_policy(model)
            model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
            """,
            target={"torch": "2.0"},
        ),
    ]
    VALID += [
        # The Trainer swaps in peft's policy for PEFT models (transformers update_fsdp_plugin_peft, from 4.39).
        Valid(
            """
            from peft import get_peft_model
            from transformers import Trainer
            model = get_peft_model(model, lora_config)
            Trainer(model=model, args=args).train()
            """,
            target={"transformers": "4.39.0", "torch": "2.2"},
            options={"accelerate_config": _ACCELERATE_FSDP1.format(orig="false")},
        ),
        # fsdp_config={"xla": True}: torch_xla's FSDP on TPU, not torch FSDP1 (accelerate's finetune_lm_tpu.py).
        Valid(
            """
            from peft import LoraConfig, get_peft_model
            from transformers import Trainer, TrainingArguments
            args = TrainingArguments(output_dir="out", fsdp="full_shard",
                                     fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], "xla": True,
                                                  "xla_fsdp_v2": True})
            model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
            Trainer(model=model, args=args).train()
            """,
            target={"transformers": "4.35.2", "torch": "2.2"},
        ),
        # trl 0.11 requires transformers >= 4.40: a job that declares trl but not transformers runs the swap.
        Valid(
            """
            from peft import LoraConfig
            from trl import SFTTrainer
            SFTTrainer(model=model, args=training_args, peft_config=LoraConfig(r=8)).train()
            """,
            target={"trl": "0.11.0", "torch": "2.2"},
            options={"accelerate_config": _ACCELERATE_FSDP1.format(orig="false")},
        ),
        Valid(
            """
            from accelerate import Accelerator
            from peft import get_peft_model
            accelerator = Accelerator()
            model = get_peft_model(model, lora_config)
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            options={"accelerate_config": _ACCELERATE_FSDP1.format(orig="true")},
        ),
        # The script hands peft's policy to accelerate's plugin (peft's peft_lora_seq2seq_accelerate_fsdp.py).
        Valid(
            """
            from accelerate import Accelerator
            from peft import LoraConfig, get_peft_model
            from peft.utils.other import fsdp_auto_wrap_policy
            accelerator = Accelerator()
            model = get_peft_model(model, LoraConfig(task_type="SEQ_2_SEQ_LM", r=8))
            if getattr(accelerator.state, "fsdp_plugin", None) is not None:
                accelerator.state.fsdp_plugin.auto_wrap_policy = fsdp_auto_wrap_policy(model)
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            options={"accelerate_config": _ACCELERATE_FSDP1.format(orig="false")},
        ),
        # Lightning's FSDPStrategy defaults use_orig_params=True on torch >= 2.0: mixed units work from 2.1.
        Valid(
            """
            from functools import partial
            import lightning as L
            from lightning.fabric.strategies import FSDPStrategy
            from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
            from peft import LoraConfig, get_peft_model

            policy = partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
            fabric = L.Fabric(devices=4, strategy=FSDPStrategy(auto_wrap_policy=policy))
            model = get_peft_model(model, LoraConfig(r=8, target_modules=["qkv"]))
            model = fabric.setup_module(model)
            """,
            target={"torch": "2.4"},
        ),
        # A strategy object nobody passes to Fabric/Trainer wraps nothing.
        Valid(
            """
            from lightning.fabric.strategies import FSDPStrategy
            from lit_llama.lora import mark_only_lora_as_trainable

            strategy = FSDPStrategy(auto_wrap_policy={Block})
            mark_only_lora_as_trainable(model)
            """,
            target={"torch": "2.0"},
        ),
    ]
    INVALID = [
        Invalid(_SELF_FROZEN, line=18, target={"torch": "2.4"}),
        # Before transformers 4.39 the Trainer kept the launch config's policy for a PEFT model.
        Invalid(
            """
            from peft import get_peft_model
            from transformers import Trainer
            model = get_peft_model(model, lora_config)
            Trainer(model=model, args=args).train()
            """,
            target={"transformers": "4.38.2", "torch": "2.6"},
            options={"accelerate_config": _ACCELERATE_FSDP1.format(orig="false")},
        ),
        # Nothing declares transformers: it swaps in peft's policy from 4.39 only, so a warning that names it.
        Invalid(
            """
            from peft import get_peft_model
            from transformers import Trainer
            model = get_peft_model(model, lora_config)
            Trainer(model=model, args=args).train()
            """,
            target={"torch": "2.6"},
            options={"accelerate_config": _ACCELERATE_FSDP1.format(orig="false")},
            severity="warning",
        ),
        Invalid(
            """
            from accelerate import Accelerator
            from peft import get_peft_model
            accelerator = Accelerator()
            model = get_peft_model(model, lora_config)
            model, optimizer = accelerator.prepare(model, optimizer)
            """,
            options={"accelerate_config": _ACCELERATE_FSDP1.format(orig="false")},
            line=6,
        ),
        Invalid(
            """
            from peft import get_peft_model
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            model = get_peft_model(model, lora_config)
            model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}), device_id=rank)
            """,
            line=5,
            expected_fix="""
            from peft import get_peft_model
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            model = get_peft_model(model, lora_config)
            model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}), device_id=rank, use_orig_params=True)
            """,
        ),
        Invalid(
            """
            import functools
            import torch.distributed.fsdp as f
            from peft import get_peft_model as add_lora
            from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

            def main(model, cfg):
                model = add_lora(model, cfg)
                policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
                model = f.FullyShardedDataParallel(
                    model,
                    auto_wrap_policy=policy,
                    use_orig_params=False,
                )
            """,
            line=9,
            expected_fix="""
            import functools
            import torch.distributed.fsdp as f
            from peft import get_peft_model as add_lora
            from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

            def main(model, cfg):
                model = add_lora(model, cfg)
                policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
                model = f.FullyShardedDataParallel(
                    model,
                    auto_wrap_policy=policy,
                    use_orig_params=True,
                )
            """,
        ),
        # torch 2.0 refuses mixed units even with use_orig_params=True (pytorch#100945).
        Invalid(
            """
            from peft import get_peft_model
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            model = get_peft_model(model, lora_config)
            model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}), use_orig_params=True)
            """,
            target={"torch": "2.0"},
            line=5,
        ),
        # No policy: the root unit holds the frozen base and the adapters.
        Invalid(
            """
            from peft import inject_adapter_in_model
            from torch.distributed.fsdp import FullyShardedDataParallel

            class Trainer:
                def setup(self):
                    self.model = inject_adapter_in_model(lora_config, self.model)
                    self.model = FullyShardedDataParallel(self.model, sync_module_states=True)
            """,
            line=7,
        ),
        # Lightning Fabric with a block-level policy over a loralib-style LoRA model on torch 2.0.
        Invalid(
            """
            from functools import partial
            import lightning as L
            from lightning.fabric.strategies import FSDPStrategy
            from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
            from lit_llama.lora import mark_only_lora_as_trainable

            def main():
                policy = partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
                strategy = FSDPStrategy(auto_wrap_policy=policy, activation_checkpointing=Block)
                fabric = L.Fabric(devices=4, strategy=strategy)
                mark_only_lora_as_trainable(model)
                model, optimizer = fabric.setup(model, optimizer)
            """,
            target={"torch": "2.0"},
            line=9,
        ),
        # Lightning Trainer, use_orig_params=False passed through to FSDP1.
        Invalid(
            """
            import lightning.pytorch as pl
            from lightning.pytorch.strategies import FSDPStrategy
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
            trainer = pl.Trainer(strategy=FSDPStrategy(auto_wrap_policy={DecoderLayer}, use_orig_params=False))
            trainer.fit(model)
            """,
            target={"torch": "2.4"},
            line=6,
        ),
        # strategy="fsdp": one root unit over the whole LoRA model, use_orig_params=False (Lightning 2.0).
        Invalid(
            """
            from lightning.fabric import Fabric
            from peft import LoraConfig, get_peft_model

            fabric = Fabric(devices=2, strategy="fsdp")
            model = fabric.setup_module(get_peft_model(model, LoraConfig(r=4, target_modules=["c_attn"])))
            """,
            target={"torch": "2.2", "lightning": "2.0.8"},
            line=4,
        ),
        # Lightning 2.0 leaves use_orig_params to FSDP (False), so torch >= 2.1 refuses the mixed blocks too.
        Invalid(
            """
            import pytorch_lightning as pl
            from pytorch_lightning.strategies import FSDPStrategy
            from peft import LoraConfig, get_peft_model

            class Module(pl.LightningModule):
                def __init__(self, base):
                    super().__init__()
                    self.model = get_peft_model(base, LoraConfig(r=8, target_modules=["q", "v"]))

            pl.Trainer(strategy=FSDPStrategy(auto_wrap_policy={T5Block})).fit(Module(base))
            """,
            target={"torch": "2.1", "lightning": "2.0.0"},
            line=10,
        ),
    ]

    # The framework's wrap (analysis/framework.py): trl's trainers given `peft_config=` inject LoRA themselves,
    # and the Trainer's own FSDP options (`TrainingArguments(fsdp=...)`) carry its use_orig_params default
    # (False before transformers 4.36) and its policy (peft's for a PEFT model from 4.39).
    INVALID += [
        # A helper returns the base model and the LoRA config; SFTTrainer applies the config itself.
        Invalid(
            """
            from peft import LoraConfig
            from trl import SFTTrainer

            def create_model(args):
                model = load(args.model_name)
                peft_config = LoraConfig(r=args.lora_r, target_modules=["q_proj", "v_proj"])
                return model, peft_config

            model, peft_config = create_model(args)
            trainer = SFTTrainer(model=model, args=training_args, peft_config=peft_config)
            trainer.train()
            """,
            target={"transformers": "4.38.2", "torch": "2.2"},
            options={"accelerate_config": _ACCELERATE_FSDP1.format(orig="false")},
        ),
        # FSDP from TrainingArguments in code: the Trainer's use_orig_params default was False before 4.36.
        Invalid(
            """
            from peft import LoraConfig, get_peft_model
            from transformers import Trainer, TrainingArguments

            args = TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap",
                                     fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]})
            model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
            Trainer(model=model, args=args, train_dataset=ds).train()
            """,
            target={"transformers": "4.35.2", "torch": "2.1"},
            line=4,
        ),
        # use_orig_params=False written in the Trainer's fsdp_config, a transformers without the policy swap.
        Invalid(
            """
            from dataclasses import dataclass
            from peft import LoraConfig
            from transformers import TrainingArguments
            from trl import SFTTrainer

            @dataclass
            class ScriptArguments:
                lora_r: int = 16

            def main(script_args):
                lora = LoraConfig(r=script_args.lora_r, target_modules="all-linear")
                targs = TrainingArguments(output_dir="o", fsdp="full_shard auto_wrap offload",
                                          fsdp_config={"use_orig_params": False})
                SFTTrainer(model="meta-llama/Llama-2-7b-hf", args=targs, peft_config=lora).train()
            """,
            target={"transformers": "4.38.2", "torch": "2.4"},
            line=13,
        ),
    ]
    VALID += [
        # transformers >= 4.39: the Trainer wraps a PEFT model with peft's policy (LoRA leaves in units of their own).
        Valid(
            """
            from peft import LoraConfig
            from trl import SFTTrainer
            peft_config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"])
            trainer = SFTTrainer(model=model, args=training_args, peft_config=peft_config)
            trainer.train()
            """,
            target={"transformers": "4.39.0", "torch": "2.2"},
            options={"accelerate_config": _ACCELERATE_FSDP1.format(orig="false")},
        ),
        # The script puts peft's policy on the trainer's plugin before train() (peft's examples/sft).
        Valid(
            """
            from peft import LoraConfig
            from peft.utils.other import fsdp_auto_wrap_policy
            from trl import SFTTrainer
            trainer = SFTTrainer(model=model, args=training_args, peft_config=LoraConfig(r=8))
            if getattr(trainer.accelerator.state, "fsdp_plugin", None):
                trainer.accelerator.state.fsdp_plugin.auto_wrap_policy = fsdp_auto_wrap_policy(trainer.model)
            trainer.train()
            """,
            target={"transformers": "4.38.2", "torch": "2.2"},
            options={"accelerate_config": _ACCELERATE_FSDP1.format(orig="false")},
        ),
        # The Trainer's own default from transformers 4.36 is use_orig_params=True: mixed units work on torch >= 2.1.
        Valid(
            """
            from peft import LoraConfig, get_peft_model
            from transformers import Trainer, TrainingArguments
            args = TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap")
            model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
            Trainer(model=model, args=args).train()
            """,
            target={"transformers": "4.37.2", "torch": "2.2"},
        ),
        # Without peft_config the trainer trains the model as given: full fine-tuning, uniform requires_grad.
        Valid(
            """
            from trl import SFTTrainer
            trainer = SFTTrainer(model=model, args=training_args, peft_config=None)
            trainer.train()
            """,
            target={"transformers": "4.38.2", "torch": "2.2"},
            options={"accelerate_config": _ACCELERATE_FSDP1.format(orig="false")},
        ),
    ]

    # Composer's Trainer(fsdp_config=...) wraps with FSDP1 in its __init__; it defaults use_orig_params to True.
    INVALID += [
        Invalid(
            """
            from composer import Trainer
            from composer.models import HuggingFaceModel
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules=["Wqkv"]))
            fsdp_config = {"sharding_strategy": "FULL_SHARD", "mixed_precision": "PURE", "use_orig_params": False}
            trainer = Trainer(model=HuggingFaceModel(model, tokenizer), train_dataloader=loader,
                              max_duration="1ep", fsdp_config=fsdp_config)
            trainer.fit()
            """,
            target={"torch": "2.4"},
            line=7,
        ),
        # torch 2.0 refuses the mixed units even with Composer's use_orig_params=True (pytorch#100945).
        Invalid(
            """
            from composer import Trainer
            from composer.models import HuggingFaceModel
            from peft import LoraConfig, get_peft_model

            def build(base, tokenizer, r):
                return HuggingFaceModel(get_peft_model(base, LoraConfig(r=r, target_modules=["q_proj"])), tokenizer)

            Trainer(model=build(base, tokenizer, 8), fsdp_config={"sharding_strategy": "FULL_SHARD"}).fit()
            """,
            target={"torch": "2.0"},
            line=8,
        ),
    ]
    VALID += [
        Valid(
            """
            from composer import Trainer
            from composer.models import HuggingFaceModel
            from peft import LoraConfig, get_peft_model

            model = HuggingFaceModel(get_peft_model(base, LoraConfig(r=16, target_modules=["Wqkv"])), tokenizer)
            Trainer(model=model, fsdp_config={"sharding_strategy": "FULL_SHARD"}).fit()
            """,
            target={"torch": "2.4"},
        ),
        # fsdp_config=None: Composer trains without FSDP.
        Valid(
            """
            from composer import Trainer
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(base, LoraConfig(r=16, target_modules=["Wqkv"]))
            Trainer(model=model, fsdp_config=None).fit()
            """,
            target={"torch": "2.0"},
        ),
    ]

    AUDIT_VALID = [
        spec(fsdp={"version": 1, "auto_wrap_policy": "peft"}),
        spec(fsdp={"version": 1, "use_orig_params": True}),
    ]
    AUDIT_INVALID = [
        spec(fsdp={"version": 1}),
        spec(fsdp={"version": 1, "use_orig_params": True, "torch": "2.0"}),
    ]

    # Freezes decided by what they freeze: a loop over a submodule's parameters, or one whose `if` reads the
    # parameter's name, freezes a part; an `if` on a flag around a loop over every parameter freezes all.
    VALID += [
        """
        from functools import partial
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        for p in model.parameters():
            if cfg.freeze_base:
                p.requires_grad = False
        policy = partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
        model = FSDP(model, auto_wrap_policy=policy)
        """,
    ]
    INVALID += [
        Invalid(
            """
            from functools import partial
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
            for p in model.model.embed_tokens.parameters():
                p.requires_grad = False
            policy = partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
            model = FSDP(model, auto_wrap_policy=policy)
            """,
            line=7,
        ),
        Invalid(
            """
            from functools import partial
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
            for name, p in model.named_parameters():
                if "lm_head" in name:
                    continue
                p.requires_grad = False
            policy = partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
            model = FSDP(model, auto_wrap_policy=policy)
            """,
            line=9,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        tv = ctx.version("torch")
        torch20 = tv < "2.1"
        manual = bool(a.calls("fsdp_wrap", "enable_wrap")) or any(
            e.ref is None or e.ref.child for e in a.events("wrap1")
        )
        self._check_launch(ctx, tv)
        self._check_lightning(ctx, tv)
        for t in a.timelines:
            for ev in t.of("wrap1"):
                if ev.ref is None or ev.ref.child or ev.entity is None:
                    continue
                lora = [e for e in t.before(ev, ("lora",)) if _trains_adapter(a, e)]
                partial_freeze = [e for e in t.before(ev, ("freeze",)) if e.data.get("partial")]
                call = ev.call
                own = None if lora or partial_freeze else _self_freezing(a, call)
                if not lora and not partial_freeze and own is None:
                    continue
                kws = a.keywords(call)
                positional = [x for x in call.node.args if x.keyword is None and not x.star]
                if kws is None or len(positional) > _POLICY_POSITION:
                    continue
                policy = _policy_kind(a, kws.get("auto_wrap_policy"), call.scope)
                if own is not None and policy == "layers":
                    units = _policy_classes(a, kws.get("auto_wrap_policy"), call.scope)
                    if units is None or own.frozen_class in units:
                        continue  # units we cannot list, or the frozen part gets a unit of its own
                if policy not in ("none", "layers") or (policy == "none" and (manual or t.escapes(ev.entity, ev))):
                    continue
                uop_expr = kws.get("use_orig_params")
                uop = a.value(uop_expr, call.scope) if uop_expr is not None else False
                if uop is UNKNOWN or (uop is not False and not torch20):
                    continue
                where = "the root unit holds every parameter" if policy == "none" else (
                    "the policy wraps whole layers, so each unit holds frozen base weights and trainable LoRA weights"
                )
                if own is not None:
                    where = (f"{own.klass}.__init__ (line {ctx.line(own.node)}) freezes self.{own.frozen} but not "
                             f"the rest of {own.klass}, and " + ("the root unit holds every parameter"
                                                                 if policy == "none" else
                                                                 f"no unit of the policy separates them"))
                split = ("Use peft's fsdp_auto_wrap_policy(model) so each LoRA layer gets its own unit" if own is None
                         else "Give the frozen submodules units of their own (a policy that also wraps them)")
                if torch20:
                    ctx.report(
                        call.node,
                        f"FSDP1 mixes frozen and trainable parameters in one unit ({where}); on {tv.describe()} "
                        f"this fails even with use_orig_params=True (\"FlatParameter requires uniform "
                        f"requires_grad\", pytorch#100945). {split}, or upgrade to torch >= 2.1.",
                    )
                    continue
                ctx.report(
                    call.node,
                    f"FSDP1 with use_orig_params=False flattens each unit into one FlatParameter with a single "
                    f"requires_grad, but {where}: wrapping raises \"ValueError: ... has both parameters with "
                    f"requires_grad=True and False\". {split}, or use_orig_params=True (more gradient memory).",
                    fix=_orig_params_fix(ctx, call),
                )

    def _check_launch(self, ctx, tv) -> None:
        """A framework's FSDP1 wrap (`accelerator.prepare`, the Trainer's `train()`, trl's trainers) of a LoRA
        model, with the job's plan (analysis/framework.py): a policy that keeps LoRA leaves out of units of their
        own and use_orig_params=False (or torch 2.0) mixes frozen and trainable parameters in one unit."""
        a = ctx.analysis
        torch20 = tv < "2.1"
        for fw in framework_wraps(a, ctx):
            if fw.version != 1 or fw.policy != "mixing":
                continue
            if fw.orig is True and not torch20:
                continue
            lora = trainable_lora_before(a, fw)
            if not lora:
                continue
            undecided = list(fw.undecided)
            if all(e.data.get("open") for e in lora):
                e = lora[0]
                undecided.append(f"whether {e.data['open']}= of the trainer (line {ctx.line(e.node)}) is a LoRA config "
                                 f"on this launch (its value is not followed to where it is built)")
            if fw.orig is None and not torch20 and not fw.orig_open:
                continue  # use_orig_params cannot be read and nothing to declare decides it
            if torch20:
                msg = (f"{fw.wrapper} wraps this LoRA model with FSDP1 and {fw.policy_text}; on {tv.describe()} "
                       f"a unit mixing frozen and trainable parameters fails even with use_orig_params=True "
                       f"(\"FlatParameter requires uniform requires_grad\", pytorch#100945). Upgrade to torch >= "
                       f"2.1, or wrap with peft's fsdp_auto_wrap_policy(model).")
            else:
                fix = {"accelerate": "set fsdp_use_orig_params: true (or use_orig_params in fsdp_config)",
                       "composer": "drop use_orig_params=False from fsdp_config (Composer's default is True)"}.get(
                    fw.plan_by, "pass fsdp_config={\"use_orig_params\": true} (or upgrade transformers)")
                msg = (f"{fw.wrapper} wraps this LoRA model with FSDP1, {fw.orig_text} and {fw.policy_text}: "
                       f"each unit flattens frozen base weights and trainable LoRA weights into one FlatParameter, "
                       f"and wrapping raises \"ValueError: ... has both parameters with requires_grad=True and "
                       f"False\". Set the plugin's auto_wrap_policy to peft's fsdp_auto_wrap_policy(model) before "
                       f"the wrap, or {fix}.")
            msg += declare_hint(fw, undecided)
            severity = Severity.WARNING if undecided else None
            where = fw.setting if fw.by != "composer" else None  # (Composer's settings are the call's own)
            ctx.report_setting(where, msg, fallback=fw.node, severity=severity, rests_on=fw.rests_on)
            return

    def _check_lightning(self, ctx, tv) -> None:
        """Lightning's FSDPStrategy (Fabric / Trainer `strategy=`) is the FSDP1 wrap: its auto_wrap_policy
        decides the units. Lightning >= 2.1 passes use_orig_params=True on torch >= 2.0, 2.0 leaves FSDP's False
        (behaviour.py `lightning_fsdp_use_orig_params`), so on torch >= 2.1 only use_orig_params=False — written,
        or Lightning 2.0's — mixes badly; an unknown Lightning version is not reported there."""
        a = ctx.analysis
        if not (a.uses_peft or a.calls("mark_only_lora_as_trainable")):
            return
        for lf in lightning_fsdp(a, ctx):
            call = lf.strategy
            if call is None:  # a registry name ("fsdp"): no auto_wrap_policy, one root unit
                kws, policy = {}, "none"
            else:
                kws = a.keywords(call)
                if kws is None:
                    continue
                policy_expr = kws.get("auto_wrap_policy")
                policy = "layers" if _module_set(a, policy_expr, call.scope) else _policy_kind(a, policy_expr, call.scope)
            if policy not in ("none", "layers"):
                continue
            uop_expr = kws.get("use_orig_params")
            uop, why = lightning_orig_params(a, ctx, lf)
            where = ("the root unit holds every parameter" if policy == "none" else
                     "the policy wraps whole blocks, so each unit holds frozen base weights and trainable LoRA weights")
            node = (call.kwarg("auto_wrap_policy") or call.node) if call is not None else lf.node
            if tv < "2.1":
                ctx.report(node, f"Lightning's FSDPStrategy wraps this LoRA model with FSDP1 and {where}; on "
                                 f"{tv.describe()} FSDP1 requires uniform requires_grad in every unit even with "
                                 f"use_orig_params=True (\"FlatParameter requires uniform requires_grad\", "
                                 f"pytorch#100945). Upgrade to torch >= 2.1, or give the LoRA layers their own units "
                                 f"(a lambda_auto_wrap_policy over the trainable leaves).")
            elif uop is False:
                ctx.report(uop_expr if uop_expr is not None else node,
                           f"Lightning's FSDPStrategy wraps this LoRA model with FSDP1, use_orig_params=False ({why}) "
                           f"and {where}: wrapping raises \"ValueError: ... has both parameters with "
                           f"requires_grad=True and False\". Drop use_orig_params=False (Lightning >= 2.1 defaults "
                           f"to True), or give the LoRA layers their own units.")

    def audit(self, ctx):
        plan = ctx.plan
        if plan.version != 1:
            return
        hint = (" Use peft's fsdp_auto_wrap_policy(model) so each LoRA layer gets its own unit, or "
                "use_orig_params=True (torch >= 2.1, at the cost of full-unit gradient memory).")
        for problem, units in ctx.grouped_plan_problems(self.code):
            ctx.report(self, f"{ctx.raised(problem)} ValueError: {problem.message}{ctx.more_units(units)}{hint}",
                       unit=units[0], field="fsdp.use_orig_params")
        if plan.use_orig_params and not ctx.torch_at_least("2.1"):
            mixed = [u for u in plan.units if len({p.requires_grad for p in u.params}) > 1]
            if mixed:
                ctx.report(self, f"torch {ctx.torch_version} ({ctx.torch_version_source}) requires uniform "
                                 f"requires_grad in every FSDP unit even with use_orig_params=True "
                                 f"(\"FlatParameter requires uniform requires_grad\"); unit {mixed[0].label} "
                                 f"mixes frozen and trainable parameters.{ctx.more_units([u.name for u in mixed])} "
                                 f"Upgrade to torch >= 2.1 or use peft's fsdp_auto_wrap_policy.",
                           unit=mixed[0].name, field="fsdp")


def _module_set(a, expr, scope) -> bool:
    """Lightning's shorthand `auto_wrap_policy={Block}`: a set of module classes (a ModuleWrapPolicy)."""
    import libcst as cst

    for _ in range(3):
        if isinstance(expr, cst.Set):
            return True
        d = dotted(expr) if expr is not None else None
        expr = a.binding(d, scope) if d else None
    return False


class _SelfFreezing:
    """A model class (or one inside it) whose `__init__` freezes one of its own submodules only."""

    def __init__(self, klass, frozen, frozen_class, node):
        self.klass, self.frozen, self.frozen_class, self.node = klass, frozen, frozen_class, node


_MODULE_CASTS = ("cuda", "to", "half", "bfloat16", "float", "cpu", "train")


def _self_freezing(a, call):
    """The wrapped model is `C(...)` of a class of this file whose own construction (its `__init__`, or that of
    a class it builds) freezes one submodule (`for p in self.k.parameters(): p.requires_grad = False`,
    `self.k.requires_grad_(False)`) next to other submodules it leaves trainable."""
    import libcst as cst

    expr = call.arg(0, "module")
    scope = call.scope
    klass = None
    for _ in range(6):
        if isinstance(expr, cst.Name):
            # The assignment that reaches the wrap: the last one before it (`model = Model(); model = FSDP(model)`).
            before = [v for seq, v in call.scope.assigns.get(expr.value, ()) if seq < call.seq]
            expr = before[-1] if before else a.binding(expr.value, scope)
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _MODULE_CASTS:
            expr = expr.func.value
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name):
            klass = expr.func.value
            break
        else:
            return None
    if klass is None:
        return None
    # The script changes requires_grad itself before wrapping: its own freeze events decide (or nothing is sure).
    if any(st.target.endswith(".requires_grad") and st.seq < call.seq for st in call.scope.attr_sets) or any(
            c.method == "requires_grad_" and c.seq < call.seq for c in call.scope.calls):
        return None
    seen: set = set()
    todo = [klass]
    while todo:
        k = todo.pop(0)
        if k in seen or len(seen) > 50:
            continue
        seen.add(k)
        init = a.c.methods.get((k, "__init__"))
        if init is None:
            continue
        subs = _submodules(a, init)
        for name, built in subs.items():
            if built in {c for c, _ in a.c.methods}:
                todo.append(built)
        hit = _frozen_part(init, subs)
        if hit is not None:
            return _SelfFreezing(k, hit[0], subs.get(hit[0]), hit[1])
    return None


def _submodules(a, init) -> dict:
    """`self.x = Cls(...)` in an `__init__` (also `nn.ModuleList([Cls() ...])`): attribute -> class name."""
    import libcst as cst

    out = {}
    for st in init.attr_sets:
        if not st.target.startswith("self.") or st.target.count(".") != 1 or st.key is not None:
            continue
        for node in _calls_in(st.value):
            name = dotted(node.func)
            if name is None:
                continue
            last = name.rsplit(".", 1)[-1]
            if last in ("ModuleList", "Sequential", "ModuleDict", "range", "len"):
                continue
            if last[:1].isupper():
                out[st.target[5:]] = last
                break
    return out


def _calls_in(expr):
    import libcst as cst

    found = []

    class V(cst.CSTVisitor):
        def visit_Call(self, node):
            found.append(node)

    if expr is not None:
        expr.visit(V())
    return found


def _frozen_part(init, subs):
    """(attribute, node) of a submodule the `__init__` freezes while another of its submodules stays trainable."""
    import libcst as cst

    frozen = {}
    for st in init.attr_sets:
        if not st.target.endswith(".requires_grad") or not st.loops:
            continue
        if not (isinstance(st.value, cst.Name) and st.value.value == "False"):
            continue
        it = st.loops[-1].iter
        if isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute) and it.func.attr.value in (
                "parameters", "named_parameters"):
            owner = dotted(it.func.value)
            if owner and owner.startswith("self.") and owner.count(".") == 1:
                frozen[owner[5:]] = st.value
    for c in init.calls:
        if c.method == "requires_grad_" and c.receiver is not None:
            owner = dotted(c.receiver)
            arg = c.arg(0, "requires_grad")
            if owner and owner.startswith("self.") and owner.count(".") == 1 and isinstance(arg, cst.Name) \
                    and arg.value == "False":
                frozen[owner[5:]] = c.node
    for name, node in frozen.items():
        if name in subs and any(other not in frozen for other in subs):
            return name, node
    return None


def _policy_classes(a, expr, scope):
    """The module class names a transformer_auto_wrap_policy / ModuleWrapPolicy wraps; None when not readable."""
    import libcst as cst

    partial = a.call_for(expr, scope, "functools_partial") if expr is not None else None
    if partial is not None:
        fn = partial.arg(0)
        if fn is None or api_of(a.resolver.qualify(fn)) != "transformer_auto_wrap_policy":
            return None
        classes = partial.kw("transformer_layer_cls")
    else:
        mwp = a.call_for(expr, scope, "ModuleWrapPolicy") if expr is not None else None
        if mwp is None:
            return None
        classes = mwp.arg(0, "module_classes")
    for _ in range(3):
        if isinstance(classes, cst.Name):
            classes = a.binding(classes.value, scope)
    if not isinstance(classes, (cst.Set, cst.List, cst.Tuple)):
        return None
    names = set()
    for el in classes.elements:
        d = dotted(el.value)
        if d is None:
            return None
        names.add(d.rsplit(".", 1)[-1])
    return names


def _trains_adapter(a, lora) -> bool:
    """True unless the adapter is loaded frozen (`PeftModel.from_pretrained` without `is_trainable=True`)."""
    call = lora.call
    if call is None or call.api != "PeftModel_from_pretrained":
        return True
    return a.value(call.kw("is_trainable"), call.scope) is True


def _policy_kind(a, expr, scope) -> str:
    """"none", "peft", "layers" (wraps whole layers/blocks: units mix frozen and LoRA) or "unknown"."""
    if expr is None or a.value(expr, scope) is None:
        return "none"
    if a.call_for(expr, scope, "peft_fsdp_auto_wrap_policy") is not None:
        return "peft"
    if a.call_for(expr, scope, "ModuleWrapPolicy") is not None:
        return "layers"
    partial = a.call_for(expr, scope, "functools_partial")
    if partial is not None:
        fn = partial.arg(0)
        api = api_of(a.resolver.qualify(fn)) if fn is not None else None
        return "layers" if api in ("transformer_auto_wrap_policy", "size_based_auto_wrap_policy") else "unknown"
    for _ in range(4):  # a bare `size_based_auto_wrap_policy`, possibly through a name
        if api_of(a.resolver.qualify(expr)) == "size_based_auto_wrap_policy":
            return "layers"
        d = dotted(expr)
        expr = a.binding(d, scope) if d else None
        if expr is None:
            break
    return "unknown"


def _orig_params_fix(ctx, call):
    """Set `use_orig_params=True` in the call itself (not when it comes from a `**dict`).

    Edits only the argument text, so a call spread over several lines keeps its layout.
    """
    arg = call.kwarg("use_orig_params")
    if arg is not None:
        return unsafe("Set use_orig_params=True", Replace(arg.value, "True"))
    if call.star_kwargs() or not call.node.args:
        return None
    last = call.node.args[-1].value
    return unsafe("Set use_orig_params=True", Replace(last, ctx.code(last) + ", use_orig_params=True"))
