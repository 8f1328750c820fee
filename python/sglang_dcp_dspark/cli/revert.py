"""``revert``: one named series, or every series found applied, restored byte for byte."""

from __future__ import annotations

import argparse

from ..core.compat import locate_tree
from ..series import patching
from .common import add_series_choice, add_target, chosen_series, print_note, print_outcome


def add_parser(sub) -> None:
    p = sub.add_parser("revert", help="undo applied patch series, restoring the files byte for byte")
    add_target(p)
    add_series_choice(p, "default: every series found applied")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    tree = locate_tree(args.target)
    chosen = chosen_series(args, None)
    if chosen is not None:
        print_outcome(patching.revert(tree, chosen))
        return 0
    print_note(patching.recover(tree, action="revert"))
    for outcome in patching.revert_found(tree):
        print_outcome(outcome)
    return 0
