from . import encoder  # noqa: F401  (registers the architecture)
