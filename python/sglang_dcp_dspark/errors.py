"""The one error type this package raises at users."""

from __future__ import annotations


class DcpDsparkError(Exception):
    """A failure the user can act on.

    The message is a single line saying what was wrong, what was expected, and
    the command that fixes it; ``main`` prints it as ``error: <message>``.
    ``exit_code`` lets a subcommand tell "sglang rejected the launch" (1) from
    "bad input" (2).
    """

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        if "\n" in message:
            raise ValueError("DcpDsparkError messages are one line")
        super().__init__(message)
        self.exit_code = exit_code
