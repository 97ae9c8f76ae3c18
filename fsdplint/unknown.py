"""`UNKNOWN`: the value of what a static read cannot know (falsy, distinct from None).

A leaf, so that the launch side (values of parsed arguments, launch settings) and the analysis share the
one sentinel without the launch package importing the analysis.
"""

from __future__ import annotations

from typing import Any

UNKNOWN: Any = type("Unknown", (), {"__repr__": lambda self: "UNKNOWN", "__bool__": lambda self: False})()
