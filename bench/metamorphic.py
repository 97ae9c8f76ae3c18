"""Metamorphic survival: do the findings of each buggy fixture script survive the refactorings users make?

Each buggy script of fixtures/scripts is rewritten without changing what it does (tests/mutations.py):
the model's loading, LoRA injection or wrapping extracted into a helper that returns a name or the call
itself, that helper moved to another module of a package, the model given a second name, the script
wrapped in `main()` or a `__main__` guard, literal settings passed through argparse flags whose defaults
are those literals, the script turned into a trainer class. A mutation *survives* when the rewritten
script gets the same rule codes, as many times each, as the original. Mutations that leave the text
unchanged (nothing to extract) are not counted.

    python bench/metamorphic.py                    # this checkout's fsdplint
    python bench/metamorphic.py --source OLD_TREE  # another checkout's fsdplint (e.g. `git archive` of a commit)
    python bench/metamorphic.py --json out.json    # also every case's result

The mutations are always this checkout's, so two runs compare the linters on the same inputs.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "fixtures" / "scripts"
TARGETS = [
    "--target-version", "torch=2.6", "--target-version", "accelerate=1.15.0", "--target-version", "peft=0.21.2",
    "--target-version", "transformers=5.24.0", "--target-version", "bitsandbytes=0.50.2",
]


def _args(name: str) -> list[str]:
    data = json.loads((SCRIPTS / name).with_suffix(".expected.json").read_text())
    args = data.get("args", []) if isinstance(data, dict) else []
    return [str(SCRIPTS / a) if a.endswith((".yaml", ".yml", ".toml")) else a for a in args]


def _codes(main, argv: list[str], stdin: str | None = None) -> Counter:
    from click.testing import CliRunner

    r = CliRunner().invoke(main, ["check", "--isolated", "--output-format", "json", "--exit-zero", "--no-cache",
                                  *TARGETS, *argv], input=stdin)
    try:
        found = json.loads(r.stdout)
    except ValueError:
        return Counter({"<crash>": 1})
    return Counter(f["code"] for f in found)


def lint_text(main, text: str, name: str) -> Counter:
    return _codes(main, [*_args(name), "--stdin-filename", name, "-"], text)


def lint_package(main, files: dict, name: str) -> Counter:
    """train.py linted as a module of a package with its siblings (the findings on it only)."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "pyproject.toml").write_text("[project]\nname = 'p'\n")
        pkg = root / "pkg"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        for fname, text in files.items():
            (pkg / fname).write_text(text)
        return _codes(main, [*(a.replace(name, "train.py") for a in _args(name)), str(pkg / "train.py")])


def mutations_table(m) -> dict:
    """name -> (seeds, function(text, rng) -> text or {file: text})."""
    return {
        "extract-helper (returns a name)": ((0, 1), lambda t, r: m.extract_helper(t, r)),
        "extract-helper (returns the call)": ((0, 1), lambda t, r: m.extract_helper(t, r, expression=True)),
        "helper in another module (returns a name)": ((0, 1), lambda t, r: m.move_helper_to_module(t, r)),
        "helper in another module (returns the call)": ((0, 1), lambda t, r: m.move_helper_to_module(t, r, expression=True)),
        "second name for the model": ((0,), m.second_name),
        "wrapped in main()": ((0,), m.wrap_in_function),
        "__main__ guard": ((0,), m.wrap_in_main_guard),
        "settings through argparse defaults": ((0, 1, 2), m.argparse_flags),
        "trainer class": ((0,), m.into_class),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=ROOT, help="the checkout whose fsdplint is measured")
    ap.add_argument("--json", type=Path, help="write every case's result here")
    opts = ap.parse_args()
    sys.path.insert(0, str(opts.source.resolve()))
    sys.path.insert(1, str(ROOT / "tests"))
    import mutations
    from fsdplint.cli import main as cli

    names = sorted(p.name for p in SCRIPTS.glob("*_buggy.py"))
    started = time.perf_counter()
    rows, cases = {}, []
    for label, (seeds, fn) in mutations_table(mutations).items():
        kept = total = 0
        for name in names:
            text = (SCRIPTS / name).read_text()
            before = lint_text(cli, text, name)
            for seed in seeds:
                out = fn(text, random.Random(seed))
                if out == text or out == {"train.py": text}:
                    continue
                after = lint_package(cli, out, name) if isinstance(out, dict) else lint_text(cli, out, name)
                total += 1
                kept += after == before
                cases.append({"mutation": label, "script": name, "seed": seed, "kept": after == before,
                              "before": dict(before), "after": dict(after)})
        rows[label] = (kept, total)
    kept = sum(k for k, _ in rows.values())
    total = sum(t for _, t in rows.values())
    print(f"fsdplint from {opts.source}: {len(names)} buggy fixture scripts, {time.perf_counter() - started:.0f} s")
    print(f"{'mutation':46s} kept/total")
    for label, (k, t) in rows.items():
        print(f"{label:46s} {k:3d}/{t:<3d} {100 * k / t if t else 0:5.1f} %")
    print(f"{'all':46s} {kept:3d}/{total:<3d} {100 * kept / total if total else 0:5.1f} %")
    lost = [c for c in cases if not c["kept"]]
    for c in lost:
        print(f"  lost: {c['mutation']} / {c['script']} seed {c['seed']}: {c['before']} -> {c['after']}")
    if opts.json:
        opts.json.write_text(json.dumps({"rows": {k: list(v) for k, v in rows.items()}, "cases": cases}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
