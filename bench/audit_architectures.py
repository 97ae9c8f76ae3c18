"""Run `fsdplint model` on every real config.json in fixtures/models/real/ and write the table in
docs/audit-architectures.md (the configs are the public hub values; nothing is downloaded).

    python bench/audit_architectures.py            # rewrite docs/audit-architectures.md
    python bench/audit_architectures.py --check    # exit 1 if the file would change

Each model is audited in three setups, all at world size 8 on the meta device:
LoRA r=16 on the attention projections under FSDP2 (fully_shard per decoder layer), the usual QLoRA
recipe under FSDP1 (4-bit, bnb_4bit_quant_storage=bfloat16, peft's fsdp_auto_wrap_policy), and
LoRA on "all-linear" under FSDP2.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "fixtures" / "models" / "real"
OUT = ROOT / "docs" / "audit-architectures.md"

# Attention projections per model type, where they are not q_proj/v_proj.
ATTENTION = {"deepseek_v3": "q_b_proj,kv_b_proj", "phi3": "qkv_proj,o_proj"}
SETUPS = (
    ("LoRA q/v, FSDP2", lambda mt: {"target_modules": ATTENTION.get(mt, "q_proj,v_proj"), "r": 16, "fsdp": "2"}),
    ("QLoRA, FSDP1 + peft policy", lambda mt: {"target_modules": ATTENTION.get(mt, "q_proj,v_proj"), "r": 16,
                                                "fsdp": "1", "quant": "4bit", "quant_storage": "bfloat16",
                                                "dtype": "bfloat16"}),
    ("LoRA all-linear, FSDP2", lambda mt: {"target_modules": "all-linear", "r": 16, "fsdp": "2"}),
)


def audit(path: Path, flags: dict):
    from fsdplint.audit import load_spec, run_audit
    from fsdplint.errors import FsdplintError

    flags = dict(flags, world_size=8)
    try:
        spec = load_spec(path, flags)
        if flags.get("quant"):
            spec.fsdp.auto_wrap_policy = "peft"
        return run_audit(spec), None
    except FsdplintError as e:
        return None, str(e)


def cell(result, error) -> str:
    from fsdplint.audit.memory import fmt_bytes

    if error is not None:
        return f"input error: {error.split(': ', 1)[-1][:80]}"
    codes = [f.code for f in result.findings if f.severity.value == "error"]
    mem = fmt_bytes(result.memory.total)
    if not codes:
        return f"passes; {mem}/rank"
    return ", ".join(dict.fromkeys(codes)) + f"; {mem}/rank"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the table is out of date")
    args = ap.parse_args()
    rows, notes = [], {}
    t0 = time.perf_counter()
    for path in sorted(REAL.glob("*.json")):
        cfg = json.loads(path.read_text())
        mt = cfg.get("model_type", "")
        cells, first = [], None
        for _, make in SETUPS:
            with contextlib.redirect_stderr(io.StringIO()):
                result, error = audit(path, make(mt))
            first = first or result
            cells.append(cell(result, error))
        s = first.summary if first else {}
        hub = path.stem.replace("--", "/")
        notes[hub] = [n for n in (first.notes if first else []) if not n.startswith(("checks target", "FSDP"))]
        rows.append((hub, s.get("architecture", "?"), f"{s.get('params', 0) / 1e9:.2f} B", s.get("dtype", "?"), *cells))
        print(f"{hub}: {' | '.join(cells)}", file=sys.stderr)
    lines = [
        "# Architectures the model audit was run on",
        "",
        "Produced by `python bench/audit_architectures.py` (transformers, peft and torch as installed: see the",
        "versions below): each model's real `config.json` (public hub values, in",
        "[fixtures/models/real/](../fixtures/models/real/)) built on the meta device and audited at world size 8.",
        "A cell lists the error codes the audit reports (see [docs/rules/](rules/index.md)) and the estimated",
        "per-rank memory before activations; \"passes\" means no error.",
        "A verdict is the audit's reading of the plan with the real libraries, not a training run; the",
        "test suite rebuilds every config (tests/test_audit_real_configs.py).",
        "",
        "Setups: **LoRA q/v, FSDP2**: LoRA r=16 on the attention projections (`q_b_proj,kv_b_proj` for",
        "DeepSeek-V3's MLA, `qkv_proj,o_proj` for Phi-3's fused projection), `fully_shard` per decoder layer. **QLoRA, FSDP1 + peft policy**: 4-bit,",
        "`bnb_4bit_quant_storage=bfloat16`, peft's `fsdp_auto_wrap_policy`, `use_orig_params=False`.",
        "**LoRA all-linear, FSDP2**: `target_modules=\"all-linear\"`.",
        "",
        "| Model | Class | Params | dtype | LoRA q/v, FSDP2 | QLoRA, FSDP1 + peft policy | LoRA all-linear, FSDP2 |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    lines += ["", "## Notes the audit printed", ""]
    for hub, ns in notes.items():
        for n in ns:
            lines.append(f"- {hub}: {n}")
    import peft
    import torch
    import transformers

    lines += ["", f"Versions: torch {torch.__version__}, transformers {transformers.__version__}, "
                  f"peft {peft.__version__}.", ""]
    text = "\n".join(lines)
    print(f"{len(rows)} models in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.check:
        return 0 if OUT.exists() and OUT.read_text() == text else 1
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
