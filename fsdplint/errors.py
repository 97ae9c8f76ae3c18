"""Errors that the CLI reports as one clear line (never a traceback)."""


class FsdplintError(Exception):
    """Base class for errors shown to the user as `fsdplint: error: <message>`."""


class UsageError(FsdplintError):
    """Bad input from the user: a flag, a configuration file, a path."""


class AuditInputError(UsageError):
    """Malformed model-audit input; the message names the file and the field."""
