"""The first release of a library where a predicate over its source holds, read at adjacent releases.

    python bench/facts/release_bisect.py trl trl/trainer/grpo_trainer.py --regex 'enable_input_require_grads'
    python bench/facts/release_bisect.py bitsandbytes bitsandbytes/nn/modules.py \\
        --regex 'def fix_4bit_weight_quant_state_from_module' --from 0.42.0 --to 0.45.0
    python bench/facts/release_bisect.py torch torch/nn/utils/clip_grad.py --ast-call get_total_norm \\
        --mirror PATH_TO_BARE_GIT_DIR --tag-pattern 'v2.*'
    python bench/facts/release_bisect.py peft src/peft/utils/other.py --check mymodule:func   # func(text) -> bool

Releases come from the package index (`pip download --no-deps`, wheels first, an sdist when a release has
no wheel) into a cache directory outside the repository (`--cache`, default ~/.cache/fsdplint-bisect), or
from the tags of a fetched git mirror (`--mirror`, read with `git show TAG:PATH`: nothing is checked out).
A release without the file counts as "does not hold". The search is binary (the predicate is assumed to
switch once, from False to True; `--until` looks for the first release where it stops holding); `--linear`
reads every release and prints each answer, which also shows a predicate that is not monotone.
Output: the last release where it does not hold and the first where it does (the two adjacent releases to
record in a behaviour entry's `read=`).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import io
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Callable, Optional

from packaging.version import InvalidVersion, Version


def index_versions(package: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package],
                         capture_output=True, text=True).stdout
    m = re.search(r"Available versions: (.*)", out)
    if not m:
        raise SystemExit(f"bisect: no versions of {package} on the index")
    return _sorted(v.strip() for v in m.group(1).split(","))


def _sorted(names) -> list[str]:
    good = []
    for n in names:
        try:
            v = Version(n.lstrip("v"))
        except InvalidVersion:
            continue
        if not v.is_prerelease and not v.local:
            good.append((v, n))
    return [n for _, n in sorted(set(good))]


class IndexSource:
    """Files of a release from the package index, cached per release."""

    def __init__(self, package: str, cache: Path):
        self.package, self.cache = package, cache / package

    def versions(self) -> list[str]:
        return index_versions(self.package)

    def read(self, version: str, path: str) -> Optional[str]:
        d = self.cache / version
        if not d.exists() or not any(d.iterdir()):
            d.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{self.package}=={version}", "-d", str(d)]
            if subprocess.run(cmd, capture_output=True).returncode != 0:
                subprocess.run(cmd + ["--no-binary", ":all:"], capture_output=True)
        for f in d.iterdir():
            text = _from_archive(f, path)
            if text is not None:
                return text
        return None


def _from_archive(f: Path, path: str) -> Optional[str]:
    if f.suffix == ".whl":
        with zipfile.ZipFile(f) as z:
            names = [n for n in z.namelist() if n == path or n.endswith("/" + path)]
            return z.read(names[0]).decode("utf-8", "replace") if names else None
    if f.name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(f) as t:
            # an sdist is NAME-VERSION/...; a src layout adds src/
            for m in t.getmembers():
                if m.isfile() and (m.name.split("/", 1)[-1] == path or m.name.endswith("/" + path)):
                    return t.extractfile(m).read().decode("utf-8", "replace")
    return None


class MirrorSource:
    """Files at the tags of a bare git mirror."""

    def __init__(self, git_dir: str, pattern: str):
        self.git_dir, self.pattern = git_dir, pattern

    def versions(self) -> list[str]:
        out = subprocess.run(["git", "--git-dir", self.git_dir, "tag", "-l", self.pattern],
                             capture_output=True, text=True).stdout
        return _sorted(out.split())

    def read(self, version: str, path: str) -> Optional[str]:
        r = subprocess.run(["git", "--git-dir", self.git_dir, "show", f"{version}:{path}"],
                           capture_output=True, text=True)
        return r.stdout if r.returncode == 0 else None


def predicate(args) -> Callable[[str], bool]:
    if args.regex:
        rx = re.compile(args.regex, re.M)
        return lambda text: rx.search(text) is not None
    if args.ast_call:
        name = args.ast_call

        def has_call(text: str) -> bool:
            try:
                tree = ast.parse(text)
            except SyntaxError:
                return False
            return any(isinstance(n, ast.Call) and (getattr(n.func, "id", None) == name
                                                    or getattr(n.func, "attr", None) == name)
                       for n in ast.walk(tree))
        return has_call
    mod, _, fn = args.check.partition(":")
    return getattr(importlib.import_module(mod), fn)


def bisect(versions: list[str], holds: Callable[[str], bool], linear: bool, log=print):
    """(last release where it does not hold, first where it does); None for a side that does not exist."""
    if linear:
        answers = [(v, holds(v)) for v in versions]
        for v, h in answers:
            log(f"  {v}: {'holds' if h else 'no'}")
        first = next((i for i, (_, h) in enumerate(answers) if h), None)
        if first is None:
            return versions[-1] if versions else None, None
        return (versions[first - 1] if first else None), versions[first]
    lo, hi = 0, len(versions)  # invariant: versions[:lo] do not hold, versions[hi:] hold
    while lo < hi:
        mid = (lo + hi) // 2
        h = holds(versions[mid])
        log(f"  {versions[mid]}: {'holds' if h else 'no'}")
        if h:
            hi = mid
        else:
            lo = mid + 1
    return (versions[lo - 1] if lo else None), (versions[lo] if lo < len(versions) else None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("package")
    p.add_argument("path", help="file inside the release, e.g. trl/trainer/grpo_trainer.py; A,B: the first present")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--regex", help="holds when the file matches this regular expression")
    g.add_argument("--ast-call", help="holds when the file calls a function or method of this name")
    g.add_argument("--check", help="MODULE:FUNC, a function of the file's text returning a bool")
    p.add_argument("--until", action="store_true", help="find where the predicate stops holding")
    p.add_argument("--linear", action="store_true", help="read every release, not a binary search")
    p.add_argument("--from", dest="lo", help="first release to consider")
    p.add_argument("--to", dest="hi", help="last release to consider")
    p.add_argument("--mirror", help="a bare git directory: read its tags instead of the index")
    p.add_argument("--tag-pattern", default="v*", help="tags of --mirror to read (git tag -l pattern)")
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/fsdplint-bisect"))
    args = p.parse_args(argv)

    src = MirrorSource(args.mirror, args.tag_pattern) if args.mirror else IndexSource(args.package, Path(args.cache))
    versions = [v for v in src.versions()
                if (args.lo is None or Version(v.lstrip("v")) >= Version(args.lo))
                and (args.hi is None or Version(v.lstrip("v")) <= Version(args.hi))]
    pred = predicate(args)

    def holds(v: str) -> bool:
        # "A,B": the file moved between releases; the first of them the release has is read.
        text = next((t for t in (src.read(v, p) for p in args.path.split(",")) if t is not None), None)
        h = text is not None and pred(text)
        return (not h) if args.until else h

    before, first = bisect(versions, holds, args.linear)
    what = "stops holding" if args.until else "holds"
    if first is None:
        print(f"{args.package}: the predicate never {what} in {versions[0]}..{versions[-1]}")
        return 1
    print(f"{args.package}: first release where it {what}: {first}; the release before: {before or '(none read)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
