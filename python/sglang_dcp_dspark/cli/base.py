"""``base`` (maintainers): the tree a series in upstream's form applies to, rebuilt from the release that shipped it."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import series as series_mod
from ..core.compat import locate_tree
from ..series import maintain


def add_parser(sub) -> None:
    p = sub.add_parser("base", help="rebuild the tree a series in upstream's form applies to, from the release that shipped it")
    p.add_argument("--series", required=True, metavar="NAME", help="e.g. upstream-pr-35221")
    p.add_argument("--from", dest="source", required=True, metavar="DIR", help="the release's tree, e.g. from pip install --no-deps --target DIR sglang==0.5.18")
    p.add_argument("--out", required=True, metavar="DIR", help="new directory for the base tree")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(maintain.reconstruct_base(locate_tree(args.source), series_mod.load_series(args.series), Path(args.out)))
    return 0
