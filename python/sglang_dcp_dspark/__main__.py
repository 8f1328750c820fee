"""Command line: ``sglang-dcp-dspark <command>``; every command returns an exit code.

Each command is a module of ``commands``;
this module only parses, dispatches and turns errors and signals into exit codes.

Exit codes: one table, :mod:`core.exits` (``python -m sglang_dcp_dspark.core.exits
--markdown``), read by ``--help`` and by the docs. With ``preflight --json``
every exit prints one JSON object with the verdict.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from . import __version__
from .core.errors import DcpDsparkError, Interrupted
from .core.exits import BAD_INPUT, INTERNAL_ERROR, OUTCOMES, help_text

TRACEBACK_ENV = "SGLANG_DCP_DSPARK_TRACEBACK"


class UsageError(Exception):
    """argparse's complaint about the command line, raised instead of its exit so it can become one line (and JSON)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse calls this for every usage error; subparsers inherit the class
        raise UsageError(message)


def _wants_json(argv: list[str]) -> bool:
    """``--json`` among preflight's own options (before ``--``), however the rest parses."""
    head = argv[: argv.index("--")] if "--" in argv else argv
    return bool(head) and head[0] == "preflight" and "--json" in head


def _usage_error(message: str, argv: list[str]) -> str:
    """argparse's message as this tool's one line: what was wrong, what was expected, the fix."""
    command = argv[0] if argv else ""
    if command == "preflight" and "unrecognized arguments" in message:
        return (f"{message}; preflight's own options come first and sglang's launch arguments after `--`; fix: "
                "sglang-dcp-dspark preflight [options] -- --model-path DIR ...")
    return f"{message}; fix: see sglang-dcp-dspark {command + ' ' if command else ''}--help"


def _json_verdict(code: int, message: str) -> None:
    """The one JSON object every preflight exit prints with --json: the verdict and the exit code."""
    import json

    outcome = OUTCOMES.get(code, "ERROR")
    print(json.dumps({"verdict": {"code": code, "outcome": outcome, "line": f"verdict: {outcome} (exit {code}): {message}"},
                      "error": message}, indent=2))


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: one subcommand per :data:`cli.PARSERS` module, in its ``--help`` order."""
    parser = _Parser(
        prog="sglang-dcp-dspark",
        description="DCP + HiCache + DSPARK for sglang: patch series, plugin and launch preflight.",
        epilog=help_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The commands are imported here, not with this module, so that a dependency missing from the environment
    # (``pip install --no-deps`` installs none) is main()'s one line, not a traceback from the console script.
    from . import cli as commands

    for command in commands.PARSERS:
        command.add_parser(sub)
    return parser


def _raise_interrupted(signum, frame) -> None:
    raise Interrupted(signum)


def missing_module(exc: ModuleNotFoundError) -> str:
    """The one line for a module the package imports that this environment lacks: the requirement the package
    declares for it where it declares one (its metadata, as installed), else the module's own name."""
    top = (exc.name or "").split(".")[0] or "?"
    spec = top
    try:
        from importlib.metadata import PackageNotFoundError, requires

        for requirement in requires("sglang-dcp-dspark") or []:
            name = requirement.split(";")[0].strip()
            if name.replace("-", "_").lower().startswith(top.lower()) and not name[len(top):][:1].isalnum():
                spec = name
                break
    except PackageNotFoundError:  # run from a checkout without the package installed
        pass
    return (f"the Python package {top!r} is not installed beside sglang-dcp-dspark, which imports it; expected "
            f"the package's dependencies installed with it (pip install --no-deps installs none); "
            f"fix: pip install '{spec}'")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    json_mode = _wants_json(argv)
    try:
        parser = build_parser()
    except ModuleNotFoundError as exc:
        message = missing_module(exc)
        if json_mode:
            _json_verdict(BAD_INPUT, message)
        print(f"error: {message}", file=sys.stderr)
        return BAD_INPUT
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        message = _usage_error(str(exc), argv)
        if json_mode:
            _json_verdict(BAD_INPUT, message)
        print(f"error: {message}", file=sys.stderr)
        return BAD_INPUT
    # A path with bytes that are not UTF-8 still prints (escaped), not a traceback.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    # SIGTERM unwinds like Ctrl-C, so temporary directories go and the tree is
    # left whole (journal.commit holds both while files move).
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            handlers[signum] = signal.signal(signum, _raise_interrupted)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe fails here, inside the try, not at exit
        return code
    except DcpDsparkError as exc:
        if json_mode and not getattr(exc, "reported", False):
            _json_verdict(exc.exit_code, str(exc))
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        name = signal.Signals(signum).name
        print(f"error: interrupted by {name} before anything was written; no sglang tree was changed", file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:
        # Nothing more can reach stdout; point it at /dev/null so the flush at exit stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        print("error: stdout was closed before the output was complete (broken pipe)", file=sys.stderr)
        return 128 + signal.SIGPIPE
    except OSError as exc:
        # Every expected I/O failure is a DcpDsparkError at its source; this
        # keeps an unforeseen one (EIO, say) to one line as well.
        print(
            f"error: unexpected I/O failure: {exc.strerror or exc} on {exc.filename or 'an open file'}; files being "
            "replaced were put back whole; fix: resolve that and rerun",
            file=sys.stderr,
        )
        return BAD_INPUT
    except Exception as exc:  # a bug of this tool's, never a verdict: its own exit code, and the traceback on request
        if os.environ.get(TRACEBACK_ENV):
            raise
        import traceback

        last = traceback.extract_tb(exc.__traceback__)[-1]
        text = " ".join(str(exc).split())[:300]
        message = (f"internal error in sglang-dcp-dspark ({type(exc).__name__}: {text}, at "
                   f"{os.path.basename(last.filename)}:{last.lineno}); this is a bug of the tool, not a verdict on the "
                   f"launch or the tree; fix: rerun with {TRACEBACK_ENV}=1 for the traceback and report it")
        if json_mode:
            _json_verdict(INTERNAL_ERROR, message)
        print(f"error: {message}", file=sys.stderr)
        return INTERNAL_ERROR
    finally:
        for signum, old in handlers.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
