"""`fsdplint run`: the user's real launch, executed in a dry-run world (fake process group of N ranks,
CUDA calls answered as on an N-GPU node, models built from config.json on the meta device, no weights).

This package executes the user's code by design; nothing in the static linter or pre-commit reaches it.
"""
