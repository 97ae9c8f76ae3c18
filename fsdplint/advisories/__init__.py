"""Known bugs of the training stack's releases, kept as data: one TOML file per advisory under `data/`.

An advisory names a library, the releases that carry the bug (`introduced`, `fixed`), the job settings that
trigger it (a predicate over facts the static side computes, see `predicate.py`), what users see, the fix,
and what was read to place each boundary. `load()` validates every file: a malformed entry is a one-line
error naming the file.
"""

from fsdplint.advisories.model import Advisory, load  # noqa: F401
