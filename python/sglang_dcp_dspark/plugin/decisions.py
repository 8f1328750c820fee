"""The plugin's decision lines: held until sglang has set up logging, then written once, in order.

sglang calls ``load_plugins()`` before it configures logging (the launcher
parses its arguments after it, and ``run_scheduler_process`` calls
``configure_logger`` right after it), so a line logged while the plugin
registers meets a root logger with no handler, or with the parent process's,
and INFO lines vanish or come out without the scheduler's " TP0" prefix. The
lines are therefore held here and written at the first of three moments:

- the first record any ``sglang.*`` logger emits after the root logger's
  handlers changed from what they were when the plugin registered (sglang's
  ``configure_logger`` and ``prepare_server_args`` both replace them with
  ``basicConfig(force=True)``): a handler on the ``sglang`` logger sees that
  record before sglang's own handlers do, writes the held lines through them,
  and takes itself off. Nothing of sglang is patched for it, so it costs no
  walk of ``sys.modules``, which a hook on ``configure_logger`` through
  sglang's HookRegistry does (about 20 ms per process);
- the first call into a hooked function, if anything would receive the lines
  by then (a process that set up logging before ``load_plugins()``);
- interpreter exit, so that a warning is never lost.

Lines said after the first write go out at once.
"""

from __future__ import annotations

import atexit
import contextlib
import logging

logger = logging.getLogger("sglang_dcp_dspark.plugin")
# Lines an operator must see whatever --log-level says (code not recognised,
# plugin off). A logger pinned at WARNING passes them on to sglang's handlers
# even when sglang sets the root logger to ERROR.
loud = logging.getLogger("sglang_dcp_dspark.plugin.always")
loud.setLevel(logging.WARNING)

_held: list[tuple[logging.Logger, int, str]] = []
_live = False
_watcher: _FirstSglangRecord | None = None


def say(level: int, message: str) -> None:
    out = loud if level >= logging.WARNING else logger
    if _live:
        out.log(level, message)
    else:
        _held.append((out, level, message))


def flush() -> None:
    """Write the held lines now; later lines go out at once."""
    global _live
    _live = True
    _unwatch()
    while _held:
        out, level, message = _held.pop(0)
        out.log(level, message)


def first_call() -> None:
    """Every hook's first line: by the first hooked call sglang's logging is in place, if it ever will be."""
    if not _live and logger.hasHandlers():
        flush()


def held() -> list[str]:
    return [message for _, _, message in _held]


class _FirstSglangRecord(logging.Handler):
    """Sees sglang's records; at the first one after logging was reconfigured, writes the held lines."""

    def __init__(self, root_handlers: list[logging.Handler]) -> None:
        super().__init__(logging.NOTSET)
        self.root_handlers = root_handlers

    def handle(self, record: logging.LogRecord) -> bool:
        if not _live and logging.getLogger().handlers != self.root_handlers:
            with contextlib.suppress(Exception):  # a log line is never worth a failed start-up
                flush()
        elif not self._others_handle(record):
            # Being a handler at all keeps Python from handing sglang's early
            # warnings to its last-resort stderr handler: do that for it.
            last = logging.lastResort
            if last is not None and record.levelno >= last.level:
                last.handle(record)
        return False

    def _others_handle(self, record: logging.LogRecord) -> bool:
        lg = logging.getLogger(record.name)
        while lg is not None:
            if any(h is not self for h in lg.handlers):
                return True
            if not lg.propagate:
                return False
            lg = lg.parent
        return False

    def emit(self, record: logging.LogRecord) -> None:  # handle() never emits
        pass


def watch() -> None:
    """Start waiting for sglang's logging set-up (called once, by ``plugin.register``)."""
    global _watcher
    if _live or _watcher is not None:
        return
    _watcher = _FirstSglangRecord(list(logging.getLogger().handlers))
    logging.getLogger("sglang").addHandler(_watcher)
    atexit.register(_at_exit)


def _unwatch() -> None:
    global _watcher
    if _watcher is None:
        return
    sglang_logger = logging.getLogger("sglang")
    # A new list, not remove(): this may run while logging iterates the old one.
    sglang_logger.handlers = [h for h in sglang_logger.handlers if h is not _watcher]
    _watcher = None


def _at_exit() -> None:
    if _held:
        with contextlib.suppress(Exception):
            flush()
