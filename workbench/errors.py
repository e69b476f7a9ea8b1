"""Errors a user can cause, and errors said in one line.

Everything raised for bad input is a `UserError`: the CLI prints its one-line message and exits
with status 2, the UI shows it as a message. `first_line` is how every layer reports an error it
caught (TVM's are pages long) in one line."""


class UserError(ValueError):
    """Bad input from a user (shape, expression, spec file, path, model, upload)."""

    def __init__(self, message: str):
        # One line, always: a multi-line message would break the CLI contract.
        super().__init__(" ".join(str(message).split()))


def first_line(err: BaseException) -> str:
    """A one-line summary of a (possibly multi-page) TVM error: its first line, plus the
    `Error message:` line a ScheduleError carries after the rendered IR."""
    lines = [l.strip() for l in str(err).splitlines() if l.strip()]
    useful = [l for l in lines if not l.startswith(("File ", "#", "Traceback", "^", "~"))]
    text = (useful or lines or [type(err).__name__])[0]
    detail = next((l for l in lines if l.startswith("Error message:")), "")
    if detail and detail != text:
        text = f"{text} {detail}"
    return text[:400]
