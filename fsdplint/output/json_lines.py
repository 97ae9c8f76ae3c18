"""One JSON object per line (ruff's `json-lines`)."""

from __future__ import annotations

import json


def write(findings, out, **_options) -> None:
    for f in findings:
        out.write(json.dumps(f.to_json(), separators=(",", ":")) + "\n")
