"""``apply``: a patch series into an sglang tree, all or nothing, even if killed."""

from __future__ import annotations

import argparse

from ..core.compat import locate_tree
from ..series import patching
from .common import DEFAULT_SERIES, add_series_choice, add_target, chosen_series, print_outcome


def add_parser(sub) -> None:
    p = sub.add_parser("apply", help="apply a patch series, all or nothing, even if killed")
    add_target(p)
    add_series_choice(p, f"a series of the package's patches/; default: {DEFAULT_SERIES}")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    tree = locate_tree(args.target)
    print_outcome(patching.apply(tree, chosen_series(args, DEFAULT_SERIES)))
    return 0
