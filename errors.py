"""User-facing errors: the command-line tools print these as one line and exit non-zero."""


class UserError(Exception):
    """Bad input from the user (a missing file, a wrong flag value); never a bug in SpecGPT."""
