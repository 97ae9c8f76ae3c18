"""A ruff-compatible JSON array of findings."""

from __future__ import annotations

import json


def write(findings, out, **_options) -> None:
    json.dump([f.to_json() for f in findings], out, indent=2)
    out.write("\n")
