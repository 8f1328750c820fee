"""The one error type this package raises at users, and the signal it turns SIGINT/SIGTERM into."""

from __future__ import annotations

import signal


class DcpDsparkError(Exception):
    """A failure the user can act on.

    The message is a single line saying what was wrong, what was expected, and
    the command that fixes it; ``main`` prints it as ``error: <message>``.
    ``exit_code`` lets a subcommand tell "sglang rejected the launch" (1) from
    "bad input" (2); an interrupted command exits 128 + the signal number.
    """

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        if "\n" in message:
            raise ValueError("DcpDsparkError messages are one line")
        super().__init__(message)
        self.exit_code = exit_code


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; not an error, so no ``except Exception`` swallows it.

    ``main`` installs handlers that raise it, so SIGTERM unwinds (temporary
    directories are removed) the way Ctrl-C does, and both exit 128 + signum.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StartupError(Exception):
    """A launch the plugin stops while sglang's scheduler starts (guard, host budget).

    Raised inside sglang, never seen by ``main``: so not a :class:`DcpDsparkError`
    and no exit code, just the one-line message sglang's launcher reports.
    """

    def __init__(self, message: str) -> None:
        if "\n" in message:
            raise ValueError("StartupError messages are one line")
        super().__init__(message)
