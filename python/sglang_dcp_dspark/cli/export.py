"""``export`` (maintainers): a working branch written back as a series, deterministically."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..series import maintain
from .common import DEFAULT_SERIES


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="re-export a series from a working branch, deterministically")
    p.add_argument("--repo", required=True, metavar="DIR", help="git checkout with the series committed on BASE")
    p.add_argument("--base", required=True, metavar="REV", help="the commit the series applies to")
    p.add_argument("--series", default=DEFAULT_SERIES, metavar="NAME")
    p.add_argument("--out", metavar="DIR", help="write here instead of the series directory")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for path in maintain.export(Path(args.repo), args.base, args.series, out_dir=args.out and Path(args.out)):
        print(path)
    return 0
