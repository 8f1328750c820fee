"""``status``: the sglang tree, the plugin's state on it and the state of each patch series.

The plugin's line is :func:`plugin.status.status_line`, judged from the
version and the environment without importing the tree; at start-up the
hooks judge the code itself.
"""

from __future__ import annotations

import argparse

from .. import series as series_mod
from ..core.compat import locate_tree
from ..plugin.status import status_line
from ..series import patching
from .common import add_target, print_note


def add_parser(sub) -> None:
    p = sub.add_parser("status", help="sglang version and the state of each patch series")
    add_target(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    tree = locate_tree(args.target)
    print_note(patching.recover(tree))
    print(f"sglang {tree.version or 'unknown'} ({tree.layout} tree) at {tree.package}")
    statuses = [patching.inspect(tree, series_mod.load_series(name)) for name in series_mod.available_series()]
    # The plugin first: where it fixes the tree at run time, an "applicable" series is not needed.
    print(f"  {status_line(tree.version, statuses)}")
    for status in statuses:
        print(f"  {status.line()}")
    return 0
