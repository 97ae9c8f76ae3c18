from fsdplint.audit.examples import spec, tiny
from fsdplint.analysis import UNKNOWN
from fsdplint.findings import Severity
from fsdplint.rule import IN_FSDP_JOB, Invalid, Rule

# Target names that show the user meant to adapt the MLP / experts, not only attention.
_MLP_NAMES = {"w1", "w2", "w3", "gate_proj", "up_proj", "down_proj", "gate_up_proj", "experts", "mlp",
              "fc1", "fc2", "c_fc", "dense_h_to_4h", "dense_4h_to_h", "all-linear"}


class ExpertsAsBareParameters(Rule):
    code = "FSDP301"
    name = "experts-as-bare-parameters"
    severity = Severity.ERROR
    summary = (
        "MoE experts stored as nn.Parameter / nn.ParameterList / fused 3-D tensors: LoRA `target_modules` "
        "cannot reach them and FSDP1 cannot wrap per expert"
    )
    sides = "SA"
    versions = {"peft": ">=0.13", "transformers": ">=4.45"}
    doc = """
    ## What it does
    Finds MoE expert weights that are bare parameters — fused 3-D tensors (Mixtral, Qwen3-MoE and GPT-OSS
    in transformers 5) or `nn.ParameterList` entries — that the LoRA config meant to adapt (its targets
    name MLP projections, or `"all-linear"`) but that received no adapter. In scripts, finds a custom
    module class that stores its experts as a 3-D `nn.Parameter` or an `nn.ParameterList`, in a script
    whose `LoraConfig(target_modules=...)` aims at the MLP/experts without `target_parameters` for them.

    ## Why is this bad?
    LoRA `target_modules` only wraps modules; a bare expert parameter has none. peft either raises
    (`Target modules {'gate_proj', ...} not found`), or silently adapts attention and shared experts only
    (`"all-linear"` on GPT-OSS), so the routed experts never train. FSDP units are modules too: all experts
    of a layer land in one unit.

    LoRA on attention only (`q_proj`, `v_proj`, ...) is a legitimate choice on an MoE model and is not
    reported; attention names the model lacks (`q_proj` on DeepSeek-V3's MLA, which has `q_a_proj`/
    `q_b_proj`) are FSDP113's finding.

    ## Example
    ```python
    LoraConfig(target_modules=["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"])  # GPT-OSS
    ```

    ## Use instead
    ```python
    LoraConfig(target_modules=["q_proj", "v_proj"],
               target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"], lora_dropout=0.0)
    ```
    (peft >= 0.17; under FSDP2 shard per decoder layer, and not under FSDP1: see FSDP303.)

    ## Fix safety
    No automatic fix.

    ## Versions
    peft >= 0.17 has `target_parameters`; peft >= 0.19 rewrites Mixtral/Qwen-MoE v4 expert names into
    `target_parameters` by itself; transformers v5 fuses experts into 3-D parameters.

    ## References
    - peft#2638, peft#3009, peft#3080, peft#3711
    - peft docs package_reference/lora.md
    """
    VALID = [
        # The fused-expert class is local to one test; the LoraConfig belongs to another.
        """
        import torch
        from torch import nn
        from peft import LoraConfig

        def test_selector_on_moe():
            class DummyMoE(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.gate_up_proj = nn.Parameter(torch.randn(2, 16, 32))
            select(DummyMoE())

        def test_text_encoder():
            cfg = LoraConfig(target_modules=["q_proj", "v_proj", "fc1", "fc2"])
        """,
        # Experts as modules: target_modules reaches every expert's Linear.
        """
        import torch.nn as nn
        from peft import LoraConfig
        class Experts(nn.Module):
            def __init__(self, n, d, f):
                super().__init__()
                self.experts = nn.ModuleList([nn.Linear(d, f) for _ in range(n)])
        cfg = LoraConfig(target_modules=["q_proj", "experts"])
        """,
        # target_parameters reaches the fused experts (peft >= 0.17).
        """
        import torch
        from torch import nn
        from peft import LoraConfig
        class MoE(nn.Module):
            def __init__(self, n, d, f):
                super().__init__()
                self.gate_up_proj = nn.Parameter(torch.empty(n, d, 2 * f))
                self.down_proj = nn.Parameter(torch.empty(n, f, d))
        cfg = LoraConfig(target_modules=["q_proj", "v_proj"], target_parameters=["experts.gate_up_proj", "experts.down_proj"], lora_dropout=0.0)
        """,
        # Attention-only LoRA on an MoE model is a legitimate choice.
        """
        import torch
        import torch.nn as nn
        from peft import LoraConfig
        class SparseMoE(nn.Module):
            def __init__(self, n, d, f):
                super().__init__()
                self.w1 = nn.Parameter(torch.empty(n, f, d))
        cfg = LoraConfig(target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        """,
        # A 3-D parameter that is not an expert bank (e.g. a conv kernel bank).
        """
        import torch
        import torch.nn as nn
        from peft import LoraConfig
        class Mixer(nn.Module):
            def __init__(self, c, k):
                super().__init__()
                self.kernel = nn.Parameter(torch.randn(c, c, k))
        cfg = LoraConfig(target_modules=["fc1", "fc2"])
        """,
    ]
    INVALID = [
        # A test that defines the fused experts and configures LoRA for them.
        Invalid(
            """
            import torch
            from torch import nn
            from peft import LoraConfig, get_peft_model

            def test_lora_on_moe():
                class DummyMoE(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.gate_up_proj = nn.Parameter(torch.randn(2, 16, 32))
                get_peft_model(DummyMoE(), LoraConfig(target_modules=["gate_up_proj"]))
            """,
            options=IN_FSDP_JOB,
            line=9,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            from peft import LoraConfig, get_peft_model

            class MoEExperts(nn.Module):
                def __init__(self, num_experts, hidden, inter):
                    super().__init__()
                    self.w1 = nn.Parameter(torch.empty(num_experts, inter, hidden))
                    self.w2 = nn.Parameter(torch.empty(num_experts, hidden, inter))

            model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj", "v_proj", "w1", "w2"]))
            """,
            options=IN_FSDP_JOB,
            line=8,
        ),
        Invalid(
            """
            import torch
            from torch import nn as tnn
            from peft import LoraConfig as LC

            class Experts(tnn.Module):
                def __init__(self, n, d, f):
                    super().__init__()
                    self.up = tnn.ParameterList([tnn.Parameter(torch.empty(f, d)) for _ in range(n)])

            config = LC(target_modules="all-linear")
            """,
            options=IN_FSDP_JOB,
            line=8,
        ),
        Invalid(
            """
            import torch
            from torch.nn import Module, Parameter
            from peft import LoraConfig

            class Block(Module):
                def __init__(self, e, d, f):
                    super().__init__()
                    self.experts_gate_up = Parameter(torch.zeros((e, d, 2 * f)).normal_(std=0.02))

            cfg = LoraConfig(target_modules=["q_proj", "gate_proj", "up_proj", "down_proj"])
            """,
            options=IN_FSDP_JOB,
            line=8,
        ),
        # A class local to a function is seen by the functions nested in it: the script body wrapped in a
        # function whose own `main()` builds the config.
        Invalid(
            """
            import torch
            import torch.nn as nn
            from peft import LoraConfig, get_peft_model

            def run():
                class MoEExperts(nn.Module):
                    def __init__(self, n, d, f):
                        super().__init__()
                        self.w1 = nn.Parameter(torch.empty(n, f, d))

                def main():
                    config = LoraConfig(r=8, target_modules=["q_proj", "w1"])
                    return get_peft_model(model, config)

                main()
            """,
            options=IN_FSDP_JOB,
            line=9,
        ),
        Invalid(
            """
            import torch
            from torch import nn
            from peft import LoraConfig

            def build_model(num_experts):
                class Experts(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.experts = nn.ParameterList([nn.Parameter(torch.empty(64, 64)) for _ in range(num_experts)])

                def lora_config():
                    return LoraConfig(target_modules=["up_proj", "down_proj"])

                return Experts(), lora_config()
            """,
            options=IN_FSDP_JOB,
            line=9,
        ),
    ]

    def check(self, ctx) -> None:
        a = ctx.analysis
        configs = []
        for lc in a.calls("LoraConfig"):
            tm = a.keyword(lc, "target_modules")
            if tm is None or tm is UNKNOWN:
                continue
            targets = a.value(tm, lc.scope)
            if targets is UNKNOWN:
                continue
            if isinstance(targets, str):
                targets = {targets}
            elif isinstance(targets, (list, tuple, set, frozenset)):
                targets = {t for t in targets if isinstance(t, str)}
            else:  # None, a number...: not a list of module names
                continue
            tp = a.keyword(lc, "target_parameters")
            tparams = a.value(tp, lc.scope) if tp is not None and tp is not UNKNOWN else []
            if tp is UNKNOWN or tparams is UNKNOWN:
                continue
            if isinstance(tparams, str):
                tparams = {tparams}
            else:
                tparams = {p for p in tparams if isinstance(p, str)} if isinstance(tparams, (list, tuple, set, frozenset)) else set()
            configs.append((lc, targets, {p.rsplit(".", 1)[-1] for p in tparams if isinstance(p, str)}))
        if not configs:
            return
        experts = _bare_experts(a)
        local = _function_local_classes(a) if experts else {}
        for klass, attr, node, kind in experts:
            for lc, targets, reached in configs:
                if attr in reached:
                    continue
                if klass in local and not _sees(local[klass], lc.scope):
                    continue  # a class defined in another function (another test): this config never sees it
                if not (targets & _MLP_NAMES or attr in targets or any(t in attr for t in targets if len(t) > 2)):
                    continue
                ctx.report(
                    node,
                    f"{klass}.{attr} stores MoE experts as {kind}: LoRA target_modules {sorted(targets)} (line "
                    f"{ctx.line(lc.node)}) only wraps modules, so these experts get no adapter and do not train "
                    f"(peft raises 'not found' or silently adapts the rest), and FSDP1 cannot wrap single experts. "
                    f"Hold experts as nn.Linear modules, or add target_parameters=[\"{attr}\"] with lora_dropout=0 "
                    f"(peft >= 0.17; under FSDP2 per decoder layer, not under FSDP1: see "
                    f"FSDP303).",
                )
                break

    AUDIT_VALID = [
        spec("mixtral", lora={"r": 8, "target_modules": ["w1", "w2", "w3"]}),
        # Attention-only LoRA on MoE models, under FSDP1 and FSDP2; DeepSeek-V3's MLA has no q_proj/v_proj:
        # that is FSDP113's finding, not this one.
        spec("mixtral"),
        spec("mixtral", fsdp={"version": 1, "use_orig_params": True}),
        spec("deepseek_v3"),
        spec("deepseek_v3", lora={"r": 8, "target_modules": ["q_b_proj", "kv_b_proj", "o_proj"]}),
    ]
    AUDIT_INVALID = [
        spec(model={"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": 64,
                    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "num_local_experts": 4,
                    "layer_types": ["sliding_attention", "full_attention"], "torch_dtype": "bfloat16"},
             lora={"r": 8, "target_modules": "all-linear"}),
        spec("qwen3_moe", lora={"r": 8, "target_modules": ["q_proj", "experts"]}),
    ]

    def audit(self, ctx):
        ctx.report_problems(self)
        built = ctx.built
        if built.lora_config is None:
            return
        targets = set(built.user_targets or [])
        if not targets & _MLP_NAMES:
            # Attention-only LoRA on an MoE model is a legitimate choice; attention targets the model
            # lacks (q_proj on DeepSeek-V3's MLA) are FSDP113's.
            return
        missed = [p for p in ctx.params if p.expert and not p.lora_reached and not p.requires_grad]
        if not missed:
            return
        first = missed[0]
        lists = any(p.owners and _is_list(ctx, p) for p in missed)
        suffixes = sorted({".".join(p.fqn.split(".")[-3:]) for p in missed})[:3]
        fsdp1 = (" FSDP1 cannot wrap single experts either: all experts of a layer form one unit."
                 if ctx.plan.version == 1 else "")
        ctx.report(self, f"{len(missed)} MoE expert parameters (e.g. {first.fqn}, shape {tuple(first.shape)}) are "
                         f"bare {'nn.ParameterList entries' if lists else 'fused nn.Parameters'} that LoRA "
                         f"target_modules {sorted(targets)} cannot reach: the routed experts get no adapter and "
                         f"do not train. peft >= 0.17 can adapt them with target_parameters="
                         f"{suffixes} and lora_dropout=0 (under FSDP2 with fully_shard per decoder layer; not "
                         f"under FSDP1, see FSDP303).{fsdp1}",
                   param=first.fqn, field="lora.target_modules")


def _is_list(ctx, info) -> bool:
    import torch.nn as nn

    mods = dict(ctx.built.model.named_modules())
    return any(isinstance(mods.get(m), (nn.ParameterList, nn.ParameterDict)) for m, _ in info.owners)


def _bare_experts(a):
    """(class, attribute, node, kind) for `self.x = nn.Parameter(<3-D>)` / `nn.ParameterList(...)` in expert classes."""
    out = []
    for scope in a.c.scopes:
        if scope.klass is None or scope.name != "__init__":
            continue
        for s in scope.attr_sets:
            if not s.target.startswith("self.") or s.target.count(".") != 1:
                continue
            attr = s.target[5:]
            call = a.call_at(s.value)
            if call is None:
                continue
            expertish = any(w in n.lower() for n in (scope.klass, attr) for w in ("expert", "moe"))
            if call.api == "nn_ParameterList" and expertish:
                out.append((scope.klass, attr, s.value, "an nn.ParameterList"))
            elif call.api == "nn_Parameter" and expertish and _dims(call.arg(0, "data")) == 3:
                out.append((scope.klass, attr, s.value, "a fused 3-D nn.Parameter"))
    return out


def _function_local_classes(a) -> dict:
    """Class name -> the function that defines it (a class inside a function is local to it)."""
    import libcst as cst

    out = {}

    def classes(stmts):
        for st in stmts:
            if isinstance(st, cst.ClassDef):
                yield st
            elif not isinstance(st, cst.FunctionDef):
                for part in (getattr(st, "body", None), getattr(st, "orelse", None), getattr(st, "finalbody", None),
                             *getattr(st, "handlers", ())):
                    inner = getattr(part, "body", None)
                    if isinstance(inner, cst.BaseSuite):
                        inner = inner.body
                    if isinstance(inner, (list, tuple)):
                        yield from classes(inner)

    for scope in a.c.scopes:
        if isinstance(scope.node, cst.FunctionDef):
            for cls in classes(scope.node.body.body):
                out.setdefault(cls.name.value, scope)
    return out


def _sees(defining, scope) -> bool:
    """Whether code in `scope` sees a class local to the function `defining`: the function itself, or a
    function nested in it (`def main():` inside a script body wrapped in a function), by lexical scoping."""
    import libcst as cst

    if scope is defining:
        return True
    target = scope.node
    if target is None:
        return False

    class Find(cst.CSTVisitor):
        found = False

        def on_visit(self, node) -> bool:
            if node is target:
                self.found = True
            return not self.found

    finder = Find()
    defining.node.body.visit(finder)
    return finder.found


def _dims(expr):
    """Number of dimensions of `torch.empty(a, b, c)` / `torch.zeros((a, b, c)).normal_()`, or None."""
    import libcst as cst

    from fsdplint.resolve import dotted

    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and isinstance(expr.func.value, cst.Call):
        expr = expr.func.value  # `.normal_()`, `.to(...)` on the factory's result
    if not isinstance(expr, cst.Call):
        return None
    fn = (dotted(expr.func) or "").rsplit(".", 1)[-1]
    if fn not in ("empty", "zeros", "ones", "randn", "rand", "full", "Tensor", "FloatTensor", "normal"):
        return None
    pos = [x for x in expr.args if x.keyword is None]
    if any(x.star for x in pos):
        return None
    if fn == "full":
        pos = pos[:1]
    if len(pos) == 1 and isinstance(pos[0].value, (cst.Tuple, cst.List)):
        els = pos[0].value.elements
        return None if any(isinstance(e, cst.StarredElement) for e in els) else len(els)
    return len(pos)
