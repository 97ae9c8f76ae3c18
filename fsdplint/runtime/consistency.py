"""Cross-rank consistency: one small exchange of per-rank fingerprints.

Happy path cost: one all-reduce of two int64 (do all ranks hold the same model
structure?), one all-reduce per replica group of a few float64 per replicated
trainable param (none for plain 1-D FSDP2), and one all_gather_object of a small
dict per rank. No weights are gathered.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.distributed as dist

from fsdplint.runtime import units
from fsdplint.runtime.units import ModelScan

# Above this many elements a replicated tensor is fingerprinted from a strided sample.
_SAMPLE_LIMIT = 1 << 22
_RTOL = 1e-6
NO_DIGEST = -1  # a rank whose local inspection failed


def spec_lines(scan: ModelScan) -> list[str]:
    """One line per param: what every rank must agree on (local shard shapes may differ)."""
    lines = []
    for r in scan.params:
        p = r.param
        placements = ""
        if units._is_dtensor(p):
            placements = ",".join(str(pl) for pl in p.placements) + f"@{tuple(p.device_mesh.shape)}"
        if r.kind == units.FSDP1 and not r.flat:
            shape = "view"  # FSDP1 original params are views of this rank's shard: sizes differ by rank
        else:
            shape = tuple(getattr(p, "_unpadded_unsharded_size", None) or p.shape)
        lines.append(f"{r.fqn} {shape} {str(p.dtype).replace('torch.', '')} grad={int(p.requires_grad)} {placements}")
    return lines


def digest(lines: list[str]) -> int:
    h = hashlib.blake2b("\n".join(lines).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") >> 1  # fits a non-negative int64


@dataclass
class ReplicaSet:
    """Trainable tensors that every rank of `group` must hold identically."""

    group: object  # ProcessGroup or None (= WORLD)
    device: torch.device
    records: list = field(default_factory=list)


def replica_sets(scan: ModelScan) -> list[ReplicaSet]:
    """Group replicated trainable params by the process group their copies live on.

    Plain tensors are replicated over the world; a DTensor with one Replicate mesh
    dim (HSDP) is replicated over that dim's group. Sharded data is not compared.
    """
    sets: dict[tuple, ReplicaSet] = {}
    for r in scan.params:
        if not r.trainable or r.flat or r.kind == units.FSDP1:
            continue  # FSDP1 data (flat params and their views) is sharded
        p = r.param
        if units._is_dtensor(p):
            rep = [i for i, pl in enumerate(p.placements) if pl.is_replicate()]
            if len(rep) != 1 or any(pl.is_partial() for pl in p.placements):
                continue
            mesh = p.device_mesh
            if mesh.size(rep[0]) <= 1:
                continue
            key = (id(mesh), rep[0])
            if key not in sets:
                sets[key] = ReplicaSet(mesh.get_group(rep[0]), torch.device(mesh.device_type), [])
        else:
            key = ("world",)
            if key not in sets:
                sets[key] = ReplicaSet(None, _comm_device(None), [])
        sets[key].records.append(r)
    return list(sets.values())


def _comm_device(group) -> torch.device:
    """A device the group's backend can reduce on."""
    if not dist.is_initialized():
        return torch.device("cpu")
    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend:
        return torch.device("cpu")
    try:
        acc = torch.accelerator.current_accelerator()
        if acc is not None:
            return torch.device(acc.type, torch.accelerator.current_device_index())
    except AttributeError:  # torch < 2.6
        pass
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@torch.no_grad()
def _stats(p: torch.Tensor) -> torch.Tensor:
    """Three float64 numbers that differ when two copies of a tensor differ."""
    x = p.to_local() if units._is_dtensor(p) else p
    flat = x.detach().reshape(-1)
    if flat.numel() > _SAMPLE_LIMIT:
        flat = flat[:: flat.numel() // _SAMPLE_LIMIT + 1]
    f = flat.to(torch.float64)
    if f.numel() == 0:
        return torch.zeros(3, dtype=torch.float64, device=f.device)
    # The strided sum makes the fingerprint sensitive to a permutation of elements.
    return torch.stack([f.sum(), (f * f).sum(), f[::7].sum() - f[1::3].sum()])


def diverged_replicas(sets: list[ReplicaSet]) -> list[str]:
    """FQNs of replicated params whose copies differ inside their replica group.

    Collective: every rank must call it with the same structure (checked before).
    """
    diverged = []
    for s in sets:
        stats = torch.stack([_stats(r.param).to(s.device) for r in s.records])
        both = torch.cat([stats, -stats]).to(s.device)
        if dist.is_initialized() and dist.get_world_size(s.group) > 1:
            dist.all_reduce(both, op=dist.ReduceOp.MAX, group=s.group)
        hi, lo = both[: len(stats)], -both[len(stats) :]
        tol = _RTOL * torch.maximum(hi.abs(), lo.abs()) + 1e-12
        bad = ((hi - lo) > tol).any(dim=1).cpu().tolist()
        diverged.extend(r.fqn for r, b in zip(s.records, bad) if b)
    return diverged


def structures_agree(local_digest: int) -> bool:
    """Collective: True when every rank reports the same structure digest."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local_digest != NO_DIGEST
    t = torch.tensor([local_digest, -local_digest], dtype=torch.int64, device=_comm_device(None))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    hi, neg_lo = t.tolist()
    return hi == -neg_lo and hi != NO_DIGEST


def gather(payload: dict) -> list[dict]:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [payload]
    out: list[Optional[dict]] = [None] * dist.get_world_size()
    dist.all_gather_object(out, payload)
    return out  # type: ignore[return-value]


def structure_diff(payloads: list[dict], local_lines: list[str]) -> Optional[str]:
    """Failure path only: explain how ranks' structures differ.

    Ranks are grouped by digest; one representative per group broadcasts its
    lines (a handful of broadcasts, whatever the world size).
    """
    reps: dict[int, list[int]] = {}
    for p in payloads:
        if p["digest"] != NO_DIGEST:
            reps.setdefault(p["digest"], []).append(p["rank"])
    if len(reps) < 2:
        return None
    variants = sorted(reps.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))[:3]
    me = dist.get_rank() if dist.is_initialized() else 0
    texts = []
    for _, ranks in variants:
        box = [local_lines if me == ranks[0] else None]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(box, src=ranks[0])
        texts.append(box[0] or [])
    base, base_ranks = set(texts[0]), variants[0][1]
    parts = []
    for (_, ranks), lines in zip(variants[1:], texts[1:]):
        mine = set(lines)
        only_base = sorted(base - mine)[:2]
        only_here = sorted(mine - base)[:2]
        detail = "; ".join(
            [f"ranks {ranges(base_ranks)} have {x!r}" for x in only_base]
            + [f"ranks {ranges(ranks)} have {x!r}" for x in only_here]
        )
        parts.append(detail)
    return " | ".join(parts)


def ranges(ranks) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    ranks = sorted(set(ranks))
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(out)


def trainable_numel(scan: ModelScan) -> int:
    return sum(units.local_trainable_numel(r) for r in scan.params)
