"""Arguments and output habits the series commands share."""

from __future__ import annotations

import argparse
import sys

from .. import series as series_mod
from ..core.errors import DcpDsparkError
from ..series import patching

DEFAULT_SERIES = "sglang-0.5.17"  # the backport; test/project/test_tripwire.py holds it to patches/trees.json
TARGET_HELP = (
    "sglang tree: a source checkout (has python/sglang) or an installed tree (has sglang/); "
    "default: the sglang this Python imports"
)
SERIES_DIR_HELP = "a series directory outside the package (its series file and patches); instead of --series"


def add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", metavar="DIR", help=TARGET_HELP)


def add_series_choice(p: argparse.ArgumentParser, series_help: str) -> None:
    p.add_argument("--series", metavar="NAME", help=series_help)
    p.add_argument("--series-dir", metavar="DIR", help=SERIES_DIR_HELP)


def chosen_series(args: argparse.Namespace, default: str | None) -> series_mod.Series | None:
    """--series names one of the package's own series; only --series-dir reads a directory."""
    if args.series_dir:
        if args.series:
            raise DcpDsparkError("--series and --series-dir name a series twice; expected one of them; fix: drop one")
        return series_mod.load_series_dir(args.series_dir)
    name = args.series or default
    return series_mod.load_series(name) if name else None


def print_note(note: str | None) -> None:
    """A recovery line goes to stderr, so stdout stays what the command itself reports."""
    if note:
        print(note, file=sys.stderr)


def print_outcome(outcome: patching.Outcome) -> None:
    """What apply or revert did: the recovery's note to stderr, the line to stdout."""
    print_note(outcome.note)
    print(outcome.line)
