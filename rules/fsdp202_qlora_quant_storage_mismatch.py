import libcst as cst

from fsdplint import behaviour
from fsdplint.audit.examples import spec
from fsdplint.analysis import UNKNOWN, QName
from fsdplint.findings import Applicability, Severity
from fsdplint.fixes import Replace, add_keyword, replace_keyword, safe
from fsdplint.launch.tools.defaults import QUANT_STORAGE_NEEDS
from fsdplint.resolve import dotted
from fsdplint.rule import Invalid, Rule, Valid
from fsdplint.rules._jobs import job_of, report_job
from fsdplint.rules._quantization import library_4bit_configs


class QloraQuantStorageMismatch(Rule):
    code = "FSDP202"
    name = "qlora-quant-storage-mismatch"
    severity = Severity.ERROR
    summary = (
        "FSDP1 QLoRA without `bnb_4bit_quant_storage` equal to the model dtype (uint8 default cannot be "
        "flattened)"
    )
    sides = "SA"
    fix = Applicability.SAFE
    versions = {"bitsandbytes": ">=0.43.0"}
    doc = """
    ## What it does
    Computes the FSDP1 flat parameters of a 4-bit model with the dtype the loaded weights will have
    (`bnb_4bit_quant_storage`, uint8 by default) and runs FSDP1's own flattening checks on each unit.
    In scripts, finds `BitsAndBytesConfig(load_in_4bit=True)` under FSDP1 (`FullyShardedDataParallel`,
    or an accelerate / Trainer FSDP1 launch) without `bnb_4bit_quant_storage`, with an integer one (such as
    a parsed argument whose default is "uint8"), or with one that differs from the `dtype=`/`torch_dtype=`
    the model is loaded with. A storage chosen by branch (`storage = None`, then `storage = torch.bfloat16`
    under an `if`; a `**d` dict filled in exclusive branches or given the storage by an `if`) is read on each
    path: a warning naming the condition when nothing the file reads decides it, an error when every path
    (or the launch) gives the integer storage. mmengine-style configs count too: `dict(type=BitsAndBytesConfig, ...)` is the
    call the registry makes, and `FSDPStrategy` / `MMFullyShardedDataParallel` wrap with FSDP1. In axolotl and LLaMA-Factory configs, finds
    a 4-bit base under FSDP1 that the tool loads without a float storage: axolotl's `adapter: lora` with
    `load_in_4bit` (before v0.13.0; axolotl sets the storage only for `adapter: qlora`), LLaMA-Factory
    with a transformers < 4.39 or bitsandbytes < 0.43 that drops its `bnb_4bit_quant_storage`.

    ## Why is this bad?
    A `FlatParameter` needs one floating dtype. With the default uint8 storage FSDP1 raises `ValueError:
    Cannot flatten integer dtype tensors` or `Must flatten tensors with uniform dtype but got
    torch.bfloat16 and torch.uint8`; a storage dtype different from the model dtype fails the same way
    (`FlatParamHandle._validate_tensors_to_flatten`, torch 2.13 distributed/fsdp/_flat_param.py).
    The audit reports this only when the 4-bit storage is what differs: float32 LoRA adapters next to a
    bf16 storage are FSDP005 (peft's fp32 adapter upcast), and when the frozen/trainable mix (FSDP004)
    fails first, this finding says it comes next.

    ## Example
    ```python
    BitsAndBytesConfig(load_in_4bit=True)  # + FSDP1
    ```

    ## Use instead
    ```python
    BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
    AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, quantization_config=bnb_config)
    ```

    ## Fix safety
    Safe, and offered only when the dtype passed to `from_pretrained(dtype=/torch_dtype=)` with this
    config is known exactly: the fix sets `bnb_4bit_quant_storage` to that same expression, which only
    changes the container dtype the packed 4-bit values are stored in. With an unknown or `"auto"` load
    dtype no fix is offered.

    ## Versions
    `bnb_4bit_quant_storage` exists from bitsandbytes 0.43.0. trl's `get_quantization_config` sets the storage
    by release (none before 0.10; `behaviour.py`); in trl's own repository (the tree holds
    `trl/trainer/utils.py` defining it) the tree's function is read instead of the release table.

    ## References
    - bitsandbytes docs fsdp_qlora.md; bnb#970
    - peft docs accelerate/fsdp.md; peft#1432; axolotl#1494; trl#1723
    """
    VALID = [
        # From trl 0.10 get_quantization_config() sets the storage to the load dtype.
        Valid(
            """
            from dataclasses import dataclass
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from transformers import AutoModelForCausalLM
            from trl import get_quantization_config

            @dataclass
            class ModelArgs:
                load_in_4bit: bool = True
                torch_dtype: str = "bfloat16"

            margs = ModelArgs()
            qc = get_quantization_config(margs)
            model = FSDP(AutoModelForCausalLM.from_pretrained("m", torch_dtype=margs.torch_dtype, quantization_config=qc))
            """,
            target={"trl": "0.10.1"},
        ),
        # The legacy keyword form passes the storage along to the config it builds.
        Valid(
            """
            import torch
            from transformers import AutoModelForCausalLM
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16, load_in_4bit=True,
                                                         bnb_4bit_quant_storage=torch.bfloat16)
            model = FSDP(model)
            """,
            target={"transformers": "4.40"},
        ),
        # TrainingArguments(fsdp=...) is FSDP2 from transformers 5.10: FSDP201's business.
        Valid(
            """
            import torch
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

            bnb = BitsAndBytesConfig(load_in_4bit=True)
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
            args = TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap")
            Trainer(model=model, args=args).train()
            """,
            target={"transformers": "5.24.0"},
        ),
        # The catalog's correct pattern: storage taken from the same variable as the load dtype.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        torch_dtype = torch.bfloat16
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch_dtype)
        model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch_dtype)
        model = FSDP(model, use_orig_params=False)
        """,
        """
        import torch
        import torch.distributed.fsdp as f
        import transformers as tr

        cfg = tr.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage="bfloat16")
        model = tr.AutoModelForCausalLM.from_pretrained("m", quantization_config=cfg, dtype=torch.bfloat16)
        model = f.FullyShardedDataParallel(model)
        """,
        # Not FSDP: plain single-GPU QLoRA keeps the uint8 default.
        """
        import torch
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig
        from peft import get_peft_model

        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, device_map="auto")
        model = get_peft_model(model, cfg)
        """,
        # FSDP2 is FSDP201's business, not this rule's.
        """
        import torch
        from torch.distributed.fsdp import fully_shard
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        bnb = BitsAndBytesConfig(load_in_4bit=True)
        model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb)
        fully_shard(model)
        """,
        # The 4-bit flag is a runtime choice the linter cannot see.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        bnb = BitsAndBytesConfig(load_in_4bit=args.qlora)
        model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
        model = FSDP(model)
        """,
        # Storage passed through a kwargs dict that the linter resolves.
        """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        qkw = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_quant_storage=torch.bfloat16)
        bnb = BitsAndBytesConfig(**qkw)
        model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
        model = FSDP(model)
        """,
        # An mmengine-style config whose 4-bit storage matches the load dtype: built as written, it flattens.
        """
        import torch
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        llm = dict(
            type=AutoModelForCausalLM.from_pretrained,
            pretrained_model_name_or_path="m",
            torch_dtype=torch.bfloat16,
            quantization_config=dict(type=BitsAndBytesConfig, load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16),
        )
        strategy = dict(type="FSDPStrategy", model_wrapper=dict(use_orig_params=True))
        """,
        # The same config trained with DeepSpeed: no FSDP, the uint8 default is fine.
        """
        import torch
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        llm = dict(
            type=AutoModelForCausalLM.from_pretrained,
            pretrained_model_name_or_path="m",
            quantization_config=dict(type=BitsAndBytesConfig, load_in_4bit=True),
        )
        strategy = dict(type="DeepSpeedStrategy", config=dict(zero_optimization=dict(stage=2)))
        """,
    ]
    INVALID = [
        # The storage is set, but bitsandbytes predates the keyword (0.43.0): the weights stay uint8.
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
            model = AutoModelForCausalLM.from_pretrained(name, quantization_config=bnb, dtype=torch.bfloat16)
            model = FSDP(model, use_orig_params=True)
            """,
            target={"bitsandbytes": "0.41.1"},
            line=4,
        ),
        # The uint8 default on one path only, under a condition nothing in the file decides: a warning naming it.
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig

            def build(cfg):
                storage = None
                if cfg.bf16:
                    storage = torch.bfloat16
                bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=storage)
                return FSDP(AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16))
            """,
            line=9,
            severity="warning",
        ),
        # An integer storage cannot be flattened whatever the model is loaded as (here: not stated).
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig

            q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.uint8)
            model = FSDP(AutoModelForCausalLM.from_pretrained("m", quantization_config=q))
            """,
            line=5,
        ),
        # An mmengine-style config (xtuner): the registry builds each `dict(type=...)`, and FSDPStrategy wraps
        # the model in FSDP1 (MMFullyShardedDataParallel).
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig

            llm = dict(
                type=AutoModelForCausalLM.from_pretrained,
                pretrained_model_name_or_path="m",
                torch_dtype=torch.bfloat16,
                quantization_config=dict(type=BitsAndBytesConfig, load_in_4bit=True, bnb_4bit_quant_type="nf4"),
            )
            strategy = dict(type="FSDPStrategy", model_wrapper=dict(use_orig_params=True))
            """,
            line=8,
        ),
        # trl's get_quantization_config() before 0.10 leaves the storage out (trl#1863).
        Invalid(
            """
            from dataclasses import dataclass
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from transformers import AutoModelForCausalLM
            from trl import get_quantization_config

            @dataclass
            class ModelArgs:
                load_in_4bit: bool = True
                torch_dtype: str = "bfloat16"

            margs = ModelArgs()
            qc = get_quantization_config(margs)
            model = FSDP(AutoModelForCausalLM.from_pretrained("m", torch_dtype=margs.torch_dtype, quantization_config=qc))
            """,
            target={"trl": "0.9.6"},
            line=12,
        ),
        # The legacy keyword form: transformers 4 builds the 4-bit config itself, uint8 storage; here the flag
        # is a dataclass field whose default is True (trl#1375's stack_llama_2 script).
        Invalid(
            """
            import torch
            from dataclasses import dataclass, field
            from transformers import AutoModelForCausalLM, HfArgumentParser
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

            @dataclass
            class ScriptArguments:
                load_in_4bit: bool = field(default=True)

            script_args = HfArgumentParser(ScriptArguments).parse_args_into_dataclasses()[0]
            model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16,
                                                         load_in_4bit=script_args.load_in_4bit)
            model = FSDP(model)
            """,
            target={"transformers": "4.36"},
            line=12,
        ),
        # ... and FSDP1 before 5.10.
        Invalid(
            """
            import torch
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

            bnb = BitsAndBytesConfig(load_in_4bit=True)
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
            args = TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap")
            Trainer(model=model, args=args).train()
            """,
            target={"transformers": "4.57.1"},
            line=4,
            expected_fix="""
            import torch
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16)
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
            args = TrainingArguments(output_dir="out", fsdp="full_shard auto_wrap")
            Trainer(model=model, args=args).train()
            """,
        ),
        Invalid(
            """
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig

            bnb_config = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=torch.bfloat16,
            )
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb_config, torch_dtype=torch.bfloat16)
            model = FSDP(model)
            """,
            line=5,
            expected_fix="""
            import torch
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig

            bnb_config = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype=torch.bfloat16,
                bnb_4bit_quant_storage=torch.bfloat16,
            )
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb_config, torch_dtype=torch.bfloat16)
            model = FSDP(model)
            """,
        ),
        Invalid(
            """
            import torch
            import torch.distributed.fsdp as f
            import transformers as tr

            dtype = torch.bfloat16
            q = tr.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.float32)
            model = tr.AutoModelForCausalLM.from_pretrained("m", quantization_config=q, dtype=dtype)
            model = f.FullyShardedDataParallel(model)
            """,
            line=6,
            expected_fix="""
            import torch
            import torch.distributed.fsdp as f
            import transformers as tr

            dtype = torch.bfloat16
            q = tr.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=dtype)
            model = tr.AutoModelForCausalLM.from_pretrained("m", quantization_config=q, dtype=dtype)
            model = f.FullyShardedDataParallel(model)
            """,
        ),
        # Load dtype unknown ("auto" reads it from the checkpoint): reported, no fix.
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig as BnB

            def load(name):
                return AutoModelForCausalLM.from_pretrained(name, quantization_config=BnB(load_in_4bit=True))

            model = FSDP(load("m"))
            """,
            line=5,
        ),
        Invalid(
            """
            from accelerate import FullyShardedDataParallelPlugin
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from transformers import AutoModelForCausalLM, BitsAndBytesConfig

            model_kwargs = dict(torch_dtype="bfloat16", quantization_config=BitsAndBytesConfig(load_in_4bit=True))
            model = AutoModelForCausalLM.from_pretrained("m", **model_kwargs)
            model = FSDP(model)
            """,
            line=5,
        ),
    ]

    def check(self, ctx) -> None:
        job = job_of(ctx)
        if job is not None:
            self._check_job(ctx, job)
            return
        a = ctx.analysis
        loads = a.calls("load_model")
        self._check_legacy(ctx, a, loads)
        self._check_returned(ctx, a)
        for bnb in a.calls("BitsAndBytesConfig"):
            if not a.fsdp1_at(bnb):
                continue
            four = _resolved(a, bnb, "load_in_4bit")
            storage = a.keyword(bnb, "bnb_4bit_quant_storage")
            if four is UNKNOWN or storage is UNKNOWN:
                self._check_dict_paths(ctx, a, bnb, loads)
                continue
            if four is not True:
                continue
            load = _load_using(a, bnb, loads)
            dtype = a.keyword(load, "dtype") if load is not None else None
            if load is not None and dtype is None:
                dtype = a.keyword(load, "torch_dtype")
            dtype_name = _dtype(a, dtype, load) if dtype is not None and dtype is not UNKNOWN else None
            given = storage is not None
            if given and a.value(storage, bnb.scope) is None:
                storage = None  # `storage = None` (on every path the known values leave): the uint8 default
            if storage is None:
                msg = ("This 4-bit config under FSDP1 keeps the default uint8 bnb_4bit_quant_storage: FSDP1 cannot "
                       "flatten integer tensors (ValueError: Must flatten tensors with uniform dtype ... torch.uint8). "
                       "Set bnb_4bit_quant_storage to the dtype the model is loaded with")
                msg += f" ({dtype_name})." if dtype_name else " and pass that dtype to from_pretrained(dtype=...)."
                fix = _fix(ctx, a, bnb, dtype, load, dtype_name, replace=given)
                ctx.report(bnb.node, msg, fix=fix)
                continue
            dropped = _storage_dropped_by(ctx)
            if dropped:
                # The keyword is set, but a library too old to know it ignores it: the weights keep uint8.
                ctx.report(
                    bnb.kwarg("bnb_4bit_quant_storage") or bnb.node,
                    f"bnb_4bit_quant_storage is set, but {' and '.join(dropped)} ignores it, so the 4-bit weights "
                    f"keep the uint8 storage under FSDP1, which cannot flatten integer tensors (ValueError: Must "
                    f"flatten tensors with uniform dtype ... torch.uint8). Install "
                    + " and ".join(f"{pkg} >= {need}" for pkg, need in STORAGE_KEYWORD_SINCE.items()) + ".",
                )
                continue
            storage_name = _dtype(a, storage, bnb)
            if storage_name is None and self._check_paths(ctx, a, bnb, storage, dtype_name):
                continue
            if storage_name in _INTEGER_DTYPES:
                # An integer storage fails whatever the load dtype (given as a value, or a parsed
                # argument's value such as a dataclass default of "uint8").
                where = _argument_origin(a, storage)
                fix = None if where else _fix(ctx, a, bnb, dtype, load, dtype_name, replace=True)
                ctx.report(
                    bnb.kwarg("bnb_4bit_quant_storage") or bnb.node,
                    f"bnb_4bit_quant_storage is {storage_name}{where} under FSDP1: FSDP1 cannot flatten integer "
                    f"tensors (ValueError: Cannot flatten integer dtype tensors). Set it to the dtype the model is "
                    f"loaded with" + (f" ({dtype_name})" if dtype_name else "")
                    + (" where that argument is given (the launch line or the recipe)." if where else "."),
                    fix=fix,
                )
                continue
            if storage_name is None or dtype_name is None:
                # Unknown values: still equal when both sides are the same variable.
                continue
            if storage_name != dtype_name:
                ctx.report(
                    bnb.kwarg("bnb_4bit_quant_storage") or bnb.node,
                    f"bnb_4bit_quant_storage is {storage_name} but the model is loaded as {dtype_name}: FSDP1 cannot "
                    f"flatten a unit mixing the 4-bit storage dtype with the other parameters' dtype (ValueError: "
                    f"Must flatten tensors with uniform dtype). Set bnb_4bit_quant_storage={dtype_name}.",
                    fix=_fix(ctx, a, bnb, dtype, load, dtype_name, replace=True),
                )

    def _check_paths(self, ctx, a, bnb, storage, dtype_name) -> bool:
        """A storage that is the uint8 default (None) or an integer dtype on some paths only (`storage = None`,
        then `storage = torch.bfloat16` under an `if` the known values do not decide): a warning naming the
        condition that decides it. (When the launch decides it, the value is single and is an error above.)"""
        conds = a.value_conditions(storage, bnb.scope, _integer_storage)
        when = _undecided_when(a, conds, bnb.scope)
        bad = [v for v in a.values(storage, bnb.scope) if _integer_storage(v)]
        if when is None or not bad:
            return False
        self._report_path(ctx, bnb, "the default uint8" if bad[0] is None else _dtype_text(bad[0]), when, dtype_name)
        return True

    def _check_dict_paths(self, ctx, a, bnb, loads) -> None:
        """`BitsAndBytesConfig(**d)` with `d` filled in exclusive branches, or given the storage by a write the
        known values do not decide: each path's keywords, a warning for a 4-bit path without a float storage."""
        paths = a.keyword_paths(bnb)
        if not paths:
            return
        bad = []
        for entries, conds in paths:
            if a.value(entries.get("load_in_4bit"), bnb.scope) is not True:
                continue
            st = entries.get("bnb_4bit_quant_storage")
            v = a.value(st, bnb.scope) if st is not None else None
            if _integer_storage(v):
                bad.append((v, conds))
        if not bad:
            return
        load = _load_using(a, bnb, loads)
        dtype = None if load is None else (a.keyword(load, "dtype") or a.keyword(load, "torch_dtype"))
        dtype_name = _dtype(a, dtype, load) if dtype is not None and dtype is not UNKNOWN else None
        if len(bad) == len(paths):
            self._report_path(ctx, bnb, "the default uint8" if bad[0][0] is None else _dtype_text(bad[0][0]),
                              None, dtype_name)
            return
        v, conds = bad[0]
        when = _undecided_when(a, conds, bnb.scope)
        if when is not None:
            self._report_path(ctx, bnb, "the default uint8" if v is None else _dtype_text(v), when, dtype_name)

    def _report_path(self, ctx, bnb, what, when, dtype_name) -> None:
        if when is None:  # every path
            ctx.report(bnb.node, f"bnb_4bit_quant_storage is {what} on every path that builds this 4-bit config under "
                                 f"FSDP1: FSDP1 cannot flatten integer tensors (ValueError: Must flatten tensors with "
                                 f"uniform dtype ... torch.uint8). Set it to the dtype the model is loaded with"
                                 + (f" ({dtype_name})." if dtype_name else "."))
            return
        ctx.report(
            bnb.kwarg("bnb_4bit_quant_storage") or bnb.node,
            f"bnb_4bit_quant_storage is {what} when {when} under FSDP1: FSDP1 cannot flatten integer tensors "
            f"(ValueError: Must flatten tensors with uniform dtype ... torch.uint8), and nothing this file reads "
            f"decides that condition: set the storage to the dtype the model is "
            f"loaded with" + (f" ({dtype_name})" if dtype_name else "") + " on every path, or declare the launch "
            "that decides it (--launch).",
            severity=Severity.WARNING,
        )

    def _check_legacy(self, ctx, a, loads) -> None:
        """`from_pretrained(..., load_in_4bit=True)` without quantization_config: transformers 4 builds the
        4-bit config itself, with the uint8 default storage unless bnb_4bit_quant_storage is passed too."""
        holds = behaviour.holds("from_pretrained_legacy_kbit", ctx.version("transformers"))
        if holds is False:
            return
        for load in loads:
            if not a.fsdp1_at(load) or a.keyword(load, "quantization_config") is not None:
                continue
            if _resolved(a, load, "load_in_4bit") is not True or a.keyword(load, "bnb_4bit_quant_storage") is not None:
                continue
            dtype = a.keyword(load, "dtype") or a.keyword(load, "torch_dtype")
            dtype_name = _dtype(a, dtype, load) if dtype is not None and dtype is not UNKNOWN else None
            ctx.report(
                load.kwarg("load_in_4bit") or load.node,
                "from_pretrained(load_in_4bit=...) builds its own 4-bit BitsAndBytesConfig with the default uint8 "
                "bnb_4bit_quant_storage, and FSDP1 cannot flatten integer tensors (ValueError: Must flatten tensors "
                "with uniform dtype ... torch.uint8). Pass quantization_config=BitsAndBytesConfig(load_in_4bit=True, "
                f"bnb_4bit_quant_storage={dtype_name or '<the dtype the model is loaded with>'}) instead.",
                severity=ctx.version_severity(ctx.version("transformers")) if holds is None else None,
                rests_on=("from_pretrained_legacy_kbit",),
            )

    def _check_returned(self, ctx, a) -> None:
        """A library function that builds the 4-bit config (apis.RETURNED_CONFIGS, e.g. trl's
        get_quantization_config): its storage field on the target release of that library."""
        for q in library_4bit_configs(ctx, a):
            if (q.behaviour is None and q.source is None) or q.storage is not None or not a.fsdp1_at(q.call):
                continue  # (an unknown release: which storage it sets cannot be told)
            whose = (f"this tree's own {q.source}" if q.source is not None
                     else ctx.version(behaviour.BEHAVIOURS[q.behaviour].package).describe())
            ctx.report(
                q.node,
                f"{ctx.code(q.node.func)}() of {whose} builds the 4-bit config "
                "without bnb_4bit_quant_storage, so the weights are stored as uint8 and FSDP1 cannot flatten "
                "integer tensors (ValueError: Must flatten tensors with uniform dtype ... torch.uint8). Pass "
                "quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=<the dtype the "
                "model is loaded with>).",
                rests_on=(q.behaviour,) if q.behaviour else (),
            )

    def _check_job(self, ctx, job) -> None:
        """An axolotl / LLaMA-Factory job: the storage the tool gives its 4-bit weights under FSDP1."""
        q = job.quant
        if q is None or q.bits != 4 or job.fsdp_version != 1:
            return
        gate = job.gate(self.code)
        if q.storage is None:
            report_job(ctx, q.setting,
                       f"{job.name} loads this model in 4-bit under FSDP1 ({job.fsdp_version_why}) with the default "
                       f"uint8 bnb_4bit_quant_storage: FSDP1 cannot flatten integer tensors (ValueError: Cannot "
                       f"flatten integer dtype tensors / Must flatten tensors with uniform dtype ... torch.uint8)",
                       gate, job.remedy.get(self.code))
        elif q.model_dtype is not None and q.storage != q.model_dtype:
            report_job(ctx, q.storage_setting or q.setting,
                       f"{job.name} stores the 4-bit weights as {q.storage} but loads the model as {q.model_dtype}: "
                       f"FSDP1 cannot flatten a unit mixing the two dtypes (ValueError: Must flatten tensors with "
                       f"uniform dtype). Set the quant storage to {q.model_dtype}", gate, job.remedy.get(self.code))

    AUDIT_VALID = [
        spec(quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"},
             fsdp={"version": 1, "auto_wrap_policy": "peft"}),
    ]
    AUDIT_INVALID = [
        spec(quantization={"load_in_4bit": True}, fsdp={"version": 1, "auto_wrap_policy": "peft"}),
        spec(quantization={"load_in_4bit": True, "bnb_4bit_quant_storage": "float32"},
             fsdp={"version": 1, "auto_wrap_policy": "peft"}),
    ]

    def audit(self, ctx):
        if ctx.plan.version != 1:
            return
        for problem, units in ctx.grouped_plan_problems(self.code):
            ctx.report(self, f"{ctx.raised(problem)} ValueError: {problem.message}.{ctx.more_units(units)} "
                             f"{problem.cause}".rstrip(), unit=units[0], field="quantization")


_DTYPE_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "bfloat16": "bfloat16",
                  "float16": "float16", "float32": "float32", "float64": "float64", "uint8": "uint8", "int8": "int8"}


_INTEGER_DTYPES = frozenset({"uint8", "int8"})


def _undecided_when(a, conds, scope):
    """The condition text of a path that nothing the file reads decides, or None (no such path, or one an
    opt-in flag or the launch decides: the runs with the flag at its default and passed each decide it)."""
    if not conds:
        return None
    for t, holds in conds:
        if a.env is not None and a._mentions_env(t, scope) and (
                a.switches(t, scope) or not a.opened_by_switch(t, scope, holds)):
            return None
    return " and ".join(" ".join(a.code(t).split()) if holds else f"not ({' '.join(a.code(t).split())})"
                        for t, holds in conds)


def _integer_storage(v) -> bool:
    """A storage value FSDP1 cannot flatten: None (bitsandbytes' uint8 default) or an integer dtype."""
    if v is None:
        return True
    if isinstance(v, QName) and v.name.startswith("torch."):
        return _DTYPE_ALIASES.get(v.name[len("torch."):]) in _INTEGER_DTYPES
    return isinstance(v, str) and _DTYPE_ALIASES.get(v) in _INTEGER_DTYPES


def _dtype_text(v) -> str:
    return v.name if isinstance(v, QName) else repr(v)


def _argument_origin(a, expr) -> str:
    """' (model_args.bnb_4bit_quant_storage: its default)' when the value is a parsed argument's."""
    env = getattr(a, "env", None)
    d = dotted(expr) if isinstance(expr, (cst.Attribute, cst.Name)) else None
    hit = env.lookup(d) if env is not None and d else None
    if hit is None or hit.origin is None:
        return ""
    return f" ({d}: {hit.origin.describe()})"


def _resolved(a, call, name):
    expr = a.keyword(call, name)
    if expr is None or expr is UNKNOWN:
        return UNKNOWN
    return a.value(expr, call.scope)


def _dtype(a, expr, call):
    """`torch.bfloat16` / `"bfloat16"` / a variable bound to one of them -> "bfloat16"; else None."""
    v = a.value(expr, call.scope if call is not None else None)
    if isinstance(v, QName) and v.name.startswith("torch."):
        return _DTYPE_ALIASES.get(v.name[len("torch."):])
    if isinstance(v, str):
        return _DTYPE_ALIASES.get(v)
    return None


def _load_using(a, bnb, loads):
    """The from_pretrained call that receives this BitsAndBytesConfig."""
    for load in loads:
        q = a.keyword(load, "quantization_config")
        if q is None or q is UNKNOWN:
            continue
        if q is bnb.node or a.call_for(q, load.scope, "BitsAndBytesConfig") is bnb:
            return load
    return None


def _fix(ctx, a, bnb, dtype, load, dtype_name, replace):
    """Set the storage to the load dtype expression, when that expression is exact and visible at the config."""
    if dtype_name is None or dtype is None or dtype is UNKNOWN:
        return None
    text = ctx.code(dtype).strip()
    if isinstance(dtype, cst.Name) and not _visible(a, dtype.value, bnb, load):
        v = a.value(dtype, load.scope)
        if not (isinstance(v, QName) and a.resolver.qualify(cst.parse_expression(v.name)) == v.name):
            return None
        text = v.name
    if not (bnb.star_kwargs() == [] or bnb.kwarg("bnb_4bit_quant_storage") is not None):
        return None  # the config is built from **kwargs: where to add it is the user's call
    if replace:
        new = replace_keyword(bnb.node, "bnb_4bit_quant_storage", text)
    else:
        new = add_keyword(bnb.node, "bnb_4bit_quant_storage", text)
    return safe(f"Set bnb_4bit_quant_storage={text}", Replace(bnb.node, new))


def _visible(a, name, bnb, load):
    """Is the variable `name` bound (once) before the config is built, in the config's scope or the module?"""
    if load is not None and load.scope is not bnb.scope and load.scope is not a.c.module_scope:
        if name in load.scope.assigns or name in load.scope.params:
            return False  # the load sees a local the config may not
    for scope in (bnb.scope, a.c.module_scope):
        vals = scope.assigns.get(name)
        if vals:
            return len(vals) == 1 and vals[0][0] < bnb.seq
        if name in scope.params:
            return scope is bnb.scope
    return False


# The releases that pass `bnb_4bit_quant_storage` on to the 4-bit weights (older ones accept and ignore it):
# the tool configs' table, one source for both.
STORAGE_KEYWORD_SINCE = QUANT_STORAGE_NEEDS


def _storage_dropped_by(ctx) -> list:
    """The declared or installed libraries too old to honour bnb_4bit_quant_storage ("bitsandbytes 0.41.1
    (--target-version) < 0.43.0"); empty when none is known to be (an unknown version is taken as current)."""
    out = []
    for pkg, need in STORAGE_KEYWORD_SINCE.items():
        tv = ctx.version(pkg)
        if tv.known and tv < need:
            out.append(f"{tv.describe()} < {need}")
    return out
