"""Errors a user can cause: the CLI prints them as one line and exits non-zero."""


class UserError(Exception):
    """Bad input, a missing file, a wrong flag: reported without a traceback."""
