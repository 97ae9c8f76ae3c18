"""Describe the machine and the library versions a benchmark ran with."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

LIBRARIES = ("fsdplint", "libcst", "torch", "transformers", "peft", "accelerate", "bitsandbytes", "click", "rich")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _git_revision(repo: Path) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return f"{rev}{' + uncommitted changes' if dirty else ''}" if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def describe(repo: Path, extra: dict[str, str] | None = None) -> list[str]:
    """Markdown bullet lines."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [
        f"- CPU: {_cpu_model()}, {cores} cores usable ({os.cpu_count()} online)",
        f"- RAM: {_ram_gib()}",
        f"- OS: {platform.platform()}",
        f"- Python: {platform.python_implementation()} {platform.python_version()} ({'virtual environment' if sys.prefix != sys.base_prefix else 'system interpreter'})",
        f"- fsdplint revision: {_git_revision(repo)}",
        "- Libraries: " + ", ".join(f"{name} {_version(name)}" for name in LIBRARIES),
    ]
    for key, value in (extra or {}).items():
        lines.append(f"- {key}: {value}")
    return lines
