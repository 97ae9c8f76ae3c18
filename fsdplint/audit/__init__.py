"""The model audit: build a model on the meta device, apply LoRA/quantization and the
FSDP plan with the real libraries, and check it (`fsdplint model CONFIG`).

Importing this package is cheap; torch and friends load on the first audit.
"""

__all__ = ["AuditInputError", "AuditResult", "AuditSpec", "audit_from_dicts", "load_spec", "run_audit",
           "spec_from_dict"]


def __getattr__(name):
    # Lazy: rule files import `fsdplint.audit.examples` on the static path, which must stay cheap.
    if name in ("AuditInputError", "AuditSpec", "load_spec", "spec_from_dict"):
        from fsdplint.audit import spec

        return getattr(spec, name)
    if name in ("run_audit", "audit_from_dicts", "AuditResult"):
        from fsdplint.audit import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'fsdplint.audit' has no attribute {name!r}")
