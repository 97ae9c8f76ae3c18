"""`fsdplint.check(model, optimizer)`: the runtime guard, called on every rank."""

from __future__ import annotations

import logging
import sys
import time
import traceback
import warnings

from fsdplint.findings import Finding, Severity

_ON_ERROR = ("raise", "warn", "log")
logger = logging.getLogger("fsdplint.runtime")


class FSDPLintError(RuntimeError):
    """Raised on every rank when the guard finds errors (on_error="raise")."""

    def __init__(self, message: str, findings: list[Finding]):
        super().__init__(message)
        self.findings = findings


class FSDPLintWarning(UserWarning):
    """Issued on rank 0 for findings when on_error="warn"."""


def check(model, optimizer=None, *, on_error: str = "raise", select=None, ignore=None) -> list[Finding]:
    """Check a wrapped model (and its optimizer) inside the distributed job.

    Call it on every rank, after wrapping and before the first step. Returns the
    combined findings of all ranks (the same list on every rank). Rank 0 reports
    them; with on_error="raise" every rank raises FSDPLintError if any is an error.
    `select`/`ignore` take codes, code prefixes or rule names, as the linter does.
    """
    import torch.distributed as dist
    from torch import nn

    from fsdplint.runtime import consistency
    from fsdplint.runtime.codes import make_finding, make_selector
    from fsdplint.runtime.local_checks import local_findings
    from fsdplint.runtime.report import merge, render
    from fsdplint.runtime.units import scan_model

    if on_error not in _ON_ERROR:
        raise ValueError(f"fsdplint.check: on_error must be one of {', '.join(_ON_ERROR)}, got {on_error!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"fsdplint.check: model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not hasattr(optimizer, "param_groups"):
        raise TypeError(f"fsdplint.check: optimizer {type(optimizer).__name__} has no param_groups")
    selected = make_selector(select, ignore)

    started = time.perf_counter()
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    # 1. Local inspection. A bug here must not leave other ranks waiting in a collective.
    internal_error = None
    try:
        scan = scan_model(model)
        found = local_findings(scan, optimizer)
        lines = consistency.spec_lines(scan)
        local_digest = consistency.digest(lines)
        sets = consistency.replica_sets(scan)
        numel = consistency.trainable_numel(scan)
    except Exception:
        internal_error = traceback.format_exc(limit=4)
        scan, found, lines, local_digest, sets, numel = None, [], [], consistency.NO_DIGEST, [], 0

    # 2. Exchange. The order of collectives depends only on values every rank agrees on.
    agree = consistency.structures_agree(local_digest)
    diverged = consistency.diverged_replicas(sets) if agree else []
    payloads = consistency.gather(
        {
            "rank": rank,
            "digest": local_digest,
            "findings": [f.to_json() for f in found],
            "numel": numel,
            "diverged": diverged,
            "error": internal_error,
        }
    )
    if not agree and not any(p["error"] for p in payloads):
        diff = consistency.structure_diff(payloads, lines)
    else:
        diff = None

    # 3. Combine (identically on every rank).
    cross = _cross_rank_findings(payloads, diff, scan, world, make_finding)
    for f in cross:
        f.notes["ranks"] = "all"  # computed from every rank's fingerprint
    merged = merge([(p["rank"], p["findings"]) for p in payloads], world) + cross
    findings = sorted((f for f in merged if selected(f.code)), key=lambda f: (f.severity.rank, f.code, f.message))
    elapsed = time.perf_counter() - started

    errors = [p for p in payloads if p["error"]]
    if errors and rank == 0:
        first = errors[0]
        logger.warning(
            "fsdplint.check could not inspect the model on rank %s (the job continues):\n%s",
            first["rank"],
            first["error"],
        )
    _report(findings, rank, world, on_error, elapsed, render)
    return findings


def _cross_rank_findings(payloads, diff, scan, world, make_finding) -> list[Finding]:
    from fsdplint.runtime.consistency import ranges

    out = []
    if diff:
        out.append(
            make_finding(
                "FSDP503",
                f"ranks hold different models ({diff}): FSDP collectives will mismatch or hang. Build the "
                "same model, LoRA config and dtype on every rank.",
            )
        )
    diverged = sorted({fqn for p in payloads for fqn in p["diverged"]})
    if diverged:
        ranks = sorted(p["rank"] for p in payloads if p["diverged"])
        shown = ", ".join(diverged[:3]) + (f", ... ({len(diverged) - 3} more)" if len(diverged) > 3 else "")
        wrapped = scan is not None and scan.wrapped
        if wrapped:
            msg = (
                f"{len(diverged)} replicated trainable param(s) differ across ranks {ranges(ranks)} "
                f"({shown}): each rank starts from a different copy and nothing will reconcile them. "
                "Seed every rank identically before get_peft_model(), or load the same weights on every rank."
            )
            out.append(make_finding("FSDP503", msg))
        else:
            msg = (
                f"{len(diverged)} trainable param(s) differ across ranks {ranges(ranks)} before wrapping "
                f"({shown}): ranks initialised or loaded them differently. FSDP will stitch every rank's "
                "shard into one tensor; seed every rank identically before get_peft_model() and load the "
                "same weights everywhere."
            )
            out.append(make_finding("FSDP503", msg, severity=Severity.WARNING))
    numels = [p["numel"] for p in payloads]
    if world > 1 and not any(p["error"] for p in payloads) and sum(numels) > 0 and 0 in numels:
        empty = [p["rank"] for p in payloads if p["numel"] == 0]
        out.append(
            make_finding(
                "FSDP502",
                f"ranks {ranges(empty)} hold no trainable elements at world size {world}: their gradient "
                "norms are empty (a harmless 'no gradients' warning when clipping). Fewer ranks or larger "
                "adapters avoid it.",
            )
        )
    return out


def _report(findings, rank, world, on_error, elapsed, render) -> None:
    errors = [f for f in findings if f.severity == Severity.ERROR]
    text = render(findings, world) + f" in {elapsed * 1000:.0f} ms" if findings else ""
    if on_error == "raise" and errors:
        codes = ", ".join(sorted({f.code for f in errors}))
        if rank == 0:
            message = "fsdplint.check found errors; stopping before the first step:\n" + text
        else:
            message = f"fsdplint.check found {len(errors)} error(s) ({codes}); the full report is on rank 0"
        raise FSDPLintError(message, findings)
    if not findings or rank != 0:
        return
    if on_error == "warn":
        warnings.warn("\n" + text, FSDPLintWarning, stacklevel=3)
    elif on_error == "log":
        logger.log(logging.ERROR if errors else logging.WARNING, "%s", text)
    else:  # "raise" with warnings/info only: print, the job continues
        print(text, file=sys.stderr, flush=True)
