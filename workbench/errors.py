"""Errors a user can cause. Everything raised for bad input is a `UserError`: the CLI prints its
one-line message and exits with status 2, the UI shows it as a message."""


class UserError(ValueError):
    """Bad input from a user (shape, expression, spec file, path, model, upload)."""

    def __init__(self, message: str):
        # One line, always: a multi-line message would break the CLI contract.
        super().__init__(" ".join(str(message).split()))
