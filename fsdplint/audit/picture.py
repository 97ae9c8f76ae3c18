"""Per-rank memory by component, as a compact text table (80 columns) and a PNG (`--plot`),
for one world size or a capacity plan over several (`--world-size 8,16,32,64`)."""

from __future__ import annotations

from typing import Optional, Sequence

from fsdplint.audit.memory import MemoryEstimate, fmt_bytes

COMPONENTS = ("params", "quant state", "grads", "optimizer", "gathered unit", "activations")
_COLORS = {"params": "#4C72B0", "quant state": "#8172B2", "grads": "#DD8452", "optimizer": "#C44E52",
           "gathered unit": "#937860", "activations": "#55A868"}


def component(label: str) -> str:
    """Which component a memory line belongs to (by the label memory.estimate gives it)."""
    if "quant_state" in label:
        return "quant state"
    if label.startswith("gradients"):
        return "grads"
    if label.startswith("AdamW"):
        return "optimizer"
    if label.startswith("largest unit"):
        return "gathered unit"
    if label.startswith("activations"):
        return "activations"
    return "params"


def breakdown(mem: MemoryEstimate) -> dict[str, int]:
    out = dict.fromkeys(COMPONENTS, 0)
    for line in mem.lines:
        if line.on_device:
            out[component(line.label)] += line.bytes
    return out


def first_fit(estimates: Sequence[MemoryEstimate], budget: Optional[int]) -> Optional[int]:
    """The smallest world size whose busiest rank fits in `budget`."""
    if not budget:
        return None
    return next((m.world_size for m in sorted(estimates, key=lambda m: m.world_size) if m.total <= budget), None)


def text_table(estimates: Sequence[MemoryEstimate], budget: Optional[int]) -> list[str]:
    """One row per world size, in GiB, no wider than 80 columns."""
    head = ["ranks", "params", "qstate", "grads", "optim", "gather", "activ", "total", ""]
    rows = [head]
    # GiB for real models, MiB for small ones (so their rows are not all 0.0).
    unit, scale = ("GiB", 2**30) if max(m.total for m in estimates) >= 10 * 2**30 else ("MiB", 2**20)
    for m in sorted(estimates, key=lambda m: m.world_size):
        b = breakdown(m)
        fits = "" if not budget else ("fits" if m.total <= budget else "OVER")
        rows.append([str(m.world_size), *(f"{b[c] / scale:.1f}" for c in COMPONENTS), f"{m.total / scale:.1f}", fits])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(0, f"Per-rank GPU memory, {unit}" + (f" (budget {fmt_bytes(budget)})" if budget else ""))
    fit = first_fit(estimates, budget)
    if budget and len(estimates) > 1:
        lines.append(f"Fits from {fit} rank{'' if fit == 1 else 's'}." if fit else "No world size planned fits the budget.")
    return lines


def draw(estimates: Sequence[MemoryEstimate], budget: Optional[int], path: str, title: str) -> None:
    """A PNG: one stacked horizontal bar per world size, the budget as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ests = sorted(estimates, key=lambda m: m.world_size)
    unit, scale = ("GiB", 2**30) if max(m.total for m in ests) >= 10 * 2**30 else ("MiB", 2**20)
    fig, ax = plt.subplots(figsize=(9, 2.4 + 0.7 * len(ests)), dpi=120)
    ys = list(range(len(ests)))
    left = [0.0] * len(ests)
    for comp in COMPONENTS:
        vals = [breakdown(m)[comp] / scale for m in ests]
        if any(vals):
            ax.barh(ys, vals, left=left, color=_COLORS[comp], label=comp, height=0.6)
            left = [a + b for a, b in zip(left, vals)]
    for y, m in zip(ys, ests):
        over = budget and m.total > budget
        ax.text(m.total / scale, y, f"  {m.total / scale:.1f} {unit}" + ("  over" if over else ""),
                va="center", fontsize=9, color="#C44E52" if over else "black")
    if budget:
        ax.axvline(budget / scale, color="black", linestyle="--", linewidth=1.2)
        ax.text(budget / scale, -0.55, f" GPU budget {fmt_bytes(budget)}", fontsize=9, va="top")
    ax.set_yticks(ys, [f"{m.world_size} rank{'' if m.world_size == 1 else 's'}" for m in ests])
    ax.set_xlabel(f"{unit} per rank (the busiest rank)")
    ax.set_xlim(0, max([*left, (budget or 0) / scale]) * 1.25 or 1)
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_ylim(-0.9, len(ests) - 0.5)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=9, ncol=6, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
