"""``workbench`` (maintainers): a git working branch with a series on its base, and the export command to run after."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import series as series_mod
from ..core.compat import locate_tree
from ..series import maintain


def add_parser(sub) -> None:
    p = sub.add_parser("workbench", help="a git working branch: the series' base files committed, the series git am'ed on top")
    p.add_argument("--series", required=True, metavar="NAME")
    p.add_argument("--from", dest="source", required=True, metavar="DIR", help="the tree the series applies to (for upstream-pr-35221: the output of base)")
    p.add_argument("--repo", required=True, metavar="DIR", help="new directory for the git repository")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    base = maintain.workbench(locate_tree(args.source), series_mod.load_series(args.series), Path(args.repo))
    print(f"{args.repo}: series {args.series} on base commit {base}; after editing, run:")
    print(f"  sglang-dcp-dspark export --repo {args.repo} --base {base} --series {args.series}")
    return 0
