from fsdplint.audit.examples import spec, tiny
from fsdplint.findings import Severity
from fsdplint.rule import IN_FSDP_JOB, Invalid, Rule, Valid
from fsdplint.rules import _lora_targets

# A hybrid mamba/attention model: attention (q/k/v/o_proj) in layers 2 and 6 of 8 only.
_JAMBA = {"model_type": "jamba", "architectures": ["JambaForCausalLM"], "attn_layer_period": 4,
          "attn_layer_offset": 2, "expert_layer_period": 2, "expert_layer_offset": 1, "num_experts": 4,
          "num_experts_per_tok": 2, "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2,
          "use_mamba_kernels": False}


class LoraTargetNotFound(Rule):
    code = "FSDP113"
    name = "lora-target-not-found"
    severity = Severity.ERROR
    summary = (
        "LoRA `target_modules` that match no module of the architecture (peft raises, or trains far less "
        "than intended)"
    )
    sides = "SA"
    doc = """
    ## What it does
    Applies the LoRA config with the real peft to the architecture (on the meta device) and reports target
    names that match no module: when none match, peft raises `ValueError: Target modules {...} not found
    in the base model`; when some match, peft silently drops the others.
    In axolotl (`lora_target_modules`) and LLaMA-Factory (`lora_target`) configs, the names are checked
    against the architecture the config names (a local config.json, axolotl's `model_type` class, or a
    well-known hub id); with an unknown architecture, nothing is reported.

    It also warns, with the wording "possibly unintended", when the targets reach far fewer modules than
    the user likely meant: none inside the decoder layers (only `lm_head`, or only a vision tower), or
    modules in fewer than half of the decoder layers (e.g. `q_proj` on a hybrid mamba/attention model).
    It stays silent when the config restricts layers on purpose (`layers_to_transform`, `layers_pattern`,
    `exclude_modules`) or the targets are a regex or name a layer index. With `fsdplint train.py --model
    config.json` these model-side findings point at the script's `target_modules=` line.

    In scripts, checks the literal `target_modules` of each `LoraConfig` against the module names of the
    architecture, when it is known: from the `--model` config (`model_type`), or from a well-known model id
    passed to `from_pretrained` (e.g. `meta-llama/Llama-3.1-8B`). Without a known architecture, a name is
    reported only when it exists in no known family (llama, mistral, mixtral, qwen2/3(-moe), gemma 1-3,
    phi/phi3, gpt2, gpt-neox, falcon, gpt-oss, t5, bert, ...) and is a near-miss of a real name (`"vproj"`).

    ## Why is this bad?
    The error surfaces only after the weights are loaded on the cluster, or — worse — training runs with a
    fraction of the intended adapters (e.g. `"vproj"` for `"v_proj"`, or `"query_key_value"` on Llama).

    ## Example
    ```python
    LoraConfig(target_modules=["q_proj", "vproj"])
    ```

    ## Use instead
    ```python
    LoraConfig(target_modules=["q_proj", "v_proj"])
    ```

    ## Fix safety
    No automatic fix: the intended module is a guess (the message suggests close names).

    ## Versions
    All peft versions.

    ## References
    - peft `check_target_module_exists` (peft/tuners/tuners_utils.py)
    """
    VALID = [
        """
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B")
        cfg = LoraConfig(r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        """,
        # A test of a custom model: another test's transformers model says nothing about its names.
        """
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        def test_custom_mlp():
            get_peft_model(MLP(), LoraConfig(target_modules=["layer1"]))

        def test_causal_lm():
            model = AutoModelForCausalLM.from_pretrained("hf-internal-testing/tiny-random-OPTForCausalLM")
            get_peft_model(model, LoraConfig(target_modules=["q_proj", "v_proj"]))
        """,
        # Names of a custom model are not guessed at.
        """
        from peft import LoraConfig as LC
        cfg = LC(r=8, target_modules=["to_q", "to_k", "to_v", "to_out.0"])
        """,
        # Regex / all-linear strings are left to the model audit.
        """
        from peft import LoraConfig
        cfg = LoraConfig(r=8, target_modules=r".*\\.(q|v)_proj")
        cfg2 = LoraConfig(r=8, target_modules="all-linear")
        """,
        """
        import peft
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained("EleutherAI/pythia-1b")
        cfg = peft.LoraConfig(target_modules=["query_key_value", "dense_h_to_4h"])
        """,
        Valid(
            """
            from peft import LoraConfig
            cfg = LoraConfig(r=8, target_modules=["w1", "w2", "w3", "q_proj"])
            """,
            options={"model_config": {"model_type": "mixtral"}},
        ),
    ]
    INVALID = [
        Invalid(
            """
            from peft import LoraConfig
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained("meta-llama/Meta-Llama-3-8B")
            cfg = LoraConfig(r=16, target_modules=["query_key_value"])
            """,
            options=IN_FSDP_JOB,
            line=4,
        ),
        Invalid(
            """
            from peft import LoraConfig as LC
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained(model_name)
            cfg = LC(r=16, target_modules=["q_proj", "vproj"])
            """,
            options=IN_FSDP_JOB,
            line=4,
        ),
        Invalid(
            """
            import peft
            targets = ["q_proj", "v_proj", "gate_up_proj"]
            cfg = peft.LoraConfig(r=8, target_modules=targets)
            """,
            line=3,
            options={**IN_FSDP_JOB, "model_config": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}},
        ),
    ]

    def check(self, ctx) -> None:
        _lora_targets.check(self, ctx)

    AUDIT_VALID = [
        spec(),
        spec(lora={"r": 8, "target_modules": "all-linear"}),
        # Restricting layers on purpose is not a mistake.
        spec(model=tiny(num_hidden_layers=4), lora={"r": 8, "target_modules": ["q_proj"], "layers_to_transform": [0]}),
        spec(model=tiny(num_hidden_layers=8, **_JAMBA), lora={"r": 8, "target_modules": ["q_proj", "in_proj"]}),
    ]
    AUDIT_INVALID = [
        spec(lora={"r": 8, "target_modules": ["q_proj", "vproj"]}),
        spec(lora={"r": 8, "target_modules": ["query_key_value"]}),
        # Jamba has attention in 2 of 8 layers (mamba elsewhere): q_proj/v_proj adapt a quarter of the model.
        spec(model=tiny(num_hidden_layers=8, **_JAMBA), lora={"r": 8, "target_modules": ["q_proj", "v_proj"]}),
        # Only the output head: the decoder layers train nothing.
        spec(lora={"r": 8, "target_modules": ["lm_head"]}),
    ]

    def audit(self, ctx):
        built = ctx.built
        for message, _, fieldpath in ctx.problems(self.code):
            ctx.report(self, message + self._suggest(ctx, built.user_targets or []), field=fieldpath)
        if not built.lora_applied:
            return
        for cov in built.coverage:
            if cov.modules == 0:
                ctx.report(self, f"LoRA target {cov.target!r} matches no module of {built.architecture}: peft "
                                 f"drops it silently and trains fewer adapters than configured."
                                 + self._suggest(ctx, [cov.target]), field="lora.target_modules")
        self._narrow_coverage(ctx)

    def _narrow_coverage(self, ctx) -> None:
        """Targets that reach far fewer modules than the user likely meant (warning wording).

        Silent when the config restricts layers on purpose (layers_to_transform, layers_pattern,
        exclude_modules) or the targets are a regex or name a layer index.
        """
        built, cfg = ctx.built, ctx.built.lora_config
        if cfg is None or not built.lora_applied:
            return
        if (getattr(cfg, "layers_to_transform", None) is not None or getattr(cfg, "layers_pattern", None)
                or getattr(cfg, "exclude_modules", None)):
            return
        if isinstance(cfg.target_modules, str) and cfg.target_modules != "all-linear":
            return
        stack = _main_stack(built.base)
        if stack is None:
            return
        prefix, n_layers = stack
        hit = [name for c in built.coverage for name in c.names]
        if not hit:
            return
        if not any(name.startswith(prefix + ".") for name in hit):
            where = sorted({_container(name) for name in hit})
            shown = ", ".join(where[:3]) + (", ..." if len(where) > 3 else "")
            leaves = _linear_leaves(built.base, prefix, range(n_layers))
            ctx.report(self, f"possibly unintended: the LoRA targets {sorted(c.target for c in built.coverage)} "
                             f"reach no module of the {n_layers} decoder layers ({prefix}), only {shown}: the "
                             f"transformer body trains no adapter. If you meant the decoder layers, target their "
                             f"projections" + (f" (e.g. {', '.join(leaves[:6])})." if leaves else "."),
                       field="lora.target_modules")
            return
        named = [c for c in built.coverage if c.names and not c.note and c.target != "all-linear"]
        if not named or len(named) < len(built.coverage) or any(ch.isdigit() for c in named for ch in c.target):
            return
        layers = sorted({int(name[len(prefix) + 1:].split(".")[0]) for c in named for name in c.names
                         if name.startswith(prefix + ".")})
        if len(layers) * 2 >= n_layers:
            return
        targets = sorted(c.target for c in named)
        missing = [i for i in range(n_layers) if i not in set(layers)]
        leaves = [x for x in _linear_leaves(built.base, prefix, missing) if x not in targets]
        shown = ", ".join(map(str, layers[:6])) + (", ..." if len(layers) > 6 else "")
        ctx.report(self, f"possibly unintended: the LoRA targets {targets} match modules in only {len(layers)} of "
                         f"{n_layers} decoder layers ({prefix}.{{{shown}}}); the other layers have no module of "
                         f"those names, so they train no adapter. If you meant every layer, add targets that exist "
                         f"there" + (f" (e.g. {', '.join(leaves[:6])})." if leaves else "."),
                   field="lora.target_modules")

    @staticmethod
    def _suggest(ctx, targets) -> str:
        import difflib

        import torch.nn as nn

        leaves = sorted({n.rsplit(".", 1)[-1] for n, m in ctx.built.base.named_modules()
                         if isinstance(m, nn.Linear) or type(m).__name__ in ("Linear4bit", "Linear8bitLt")})
        leaves = [n for n in leaves if n not in ("base_layer", "default")]
        close = sorted({c for t in targets for c in difflib.get_close_matches(t, leaves, n=3, cutoff=0.6)})
        shown = close or leaves[:8]
        return f" {'Did you mean' if close else 'Linear modules here'}: {', '.join(shown)}." if shown else ""


def _main_stack(model):
    """(name, length) of the ModuleList of repeated blocks holding the most parameters (the decoder layers)."""
    import torch.nn as nn

    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) >= 2 and name:
            numel = sum(p.numel() for p in mod.parameters())
            if best is None or numel > best[0]:
                best = (numel, name, len(mod))
    return (best[1], best[2]) if best else None


def _container(name: str) -> str:
    """`model.visual.blocks.3.attn.qkv` -> `model.visual.blocks`; `lm_head` -> `lm_head`."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i]) or name
    return name


def _linear_leaves(model, prefix: str, layers) -> list:
    """Leaf names of the linear modules in the given layers of the stack at `prefix`, most common first."""
    import collections

    import torch.nn as nn

    wanted = {f"{prefix}.{i}" for i in layers}
    counts = collections.Counter()
    for name, mod in model.named_modules():
        head = ".".join(name.split(".")[: prefix.count(".") + 2])
        if head not in wanted or not (isinstance(mod, nn.Linear) or type(mod).__name__ in ("Linear4bit", "Linear8bitLt")):
            continue
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in ("base_layer", "default") and ".lora_" not in name:
            counts[leaf] += 1
    return [n for n, _ in counts.most_common()]
