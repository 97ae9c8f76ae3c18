"""The benchmark corpus: real FSDP/LoRA library source from the active environment.

Nothing is downloaded or committed: the files are collected at run time from the
site-packages of the interpreter running the harness and copied into a temporary
directory (optionally several times, for the scaling scenario).
"""

from __future__ import annotations

import shutil
import site
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# The fixed subset (globs relative to site-packages). The full trees are ~1.5M lines; TorchFix
# lints ~0.5-1k lines/s here, so the full trees would take about an hour per TorchFix run.
# The subset is the FSDP/LoRA core of each library: code a linter for training scripts meets.
SUBSET = (
    "accelerate/accelerator.py",
    "accelerate/utils/fsdp_utils.py",
    "accelerate/utils/dataclasses.py",
    "peft/peft_model.py",
    "peft/tuners/lora/*.py",
    "torch/distributed/fsdp/*.py",
    "torch/distributed/fsdp/*/*.py",
    "transformers/models/llama/*.py",
    "transformers/models/mistral/*.py",
    "transformers/models/mixtral/*.py",
    "transformers/models/qwen2/*.py",
    "transformers/trainer.py",
    "transformers/training_args.py",
    "transformers/integrations/fsdp.py",
)

# The full trees the issue names (for `--corpus full`; too slow for TorchFix).
FULL = (
    "transformers/**/*.py",
    "peft/**/*.py",
    "accelerate/**/*.py",
    "torch/distributed/**/*.py",
)


@dataclass(frozen=True)
class Corpus:
    root: Path  # directory handed to every tool
    files: int
    lines: int
    bytes: int


def site_packages() -> Path:
    """The site-packages directory that holds transformers in this environment."""
    candidates = [Path(sysconfig.get_paths()["purelib"]), *map(Path, site.getsitepackages())]
    for cand in candidates:
        if (cand / "transformers").is_dir():
            return cand
    import importlib.util

    spec = importlib.util.find_spec("transformers")  # an environment that extends another's site-packages
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parent.parent
    raise SystemExit("bench: transformers is not installed in this environment; activate the project venv")


def collect(kind: str = "subset") -> list[Path]:
    """Sorted relative paths of the corpus files (relative to site-packages)."""
    base = site_packages()
    found: set[Path] = set()
    for pattern in SUBSET if kind == "subset" else FULL:
        found.update(p.relative_to(base) for p in base.glob(pattern) if p.is_file())
    if not found:
        raise SystemExit(f"bench: no corpus files found under {base}")
    return sorted(found)


def materialize(dest: Path, kind: str = "subset", copies: int = 1) -> Corpus:
    """Copy the corpus `copies` times under `dest` (copy1/, copy2/, ...) and measure it."""
    base = site_packages()
    rel = collect(kind)
    files = lines = size = 0
    for i in range(1, copies + 1):
        for r in rel:
            target = dest / f"copy{i}" / r
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(base / r, target)
            data = target.read_bytes()
            files += 1
            lines += data.count(b"\n")
            size += len(data)
    return Corpus(dest, files, lines, size)


def synthetic(dest: Path, target_bytes: int, template: Path) -> Corpus:
    """One big file: the template's imports once, then its definitions repeated (renamed) to `target_bytes`.

    Checks that nothing in the analysis is quadratic in the size of a file.
    """
    import re

    text = template.read_text()
    main_at = text.index('\nif __name__ == "__main__":')
    first_def = min(m.start() for m in re.finditer(r"^(?:@|class |def )", text, re.M))
    head, body = text[:first_def], text[first_def:main_at]
    names = re.findall(r"^(?:class|def) (\w+)", body, re.M)
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    parts, size, i = [head], len(head), 0
    while size < target_bytes:
        chunk = pattern.sub(lambda m: f"{m.group(1)}_{i}", body)
        parts.append(chunk)
        size += len(chunk)
        i += 1
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"generated_{target_bytes // 1000}k.py"
    data = "".join(parts).encode()
    out.write_bytes(data)
    return Corpus(out, 1, data.count(b"\n"), len(data))
