"""Command line: ``sglang-dcp-dspark <command>``; every command returns an exit code."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __version__
from .errors import DcpDsparkError

DEFAULT_SERIES = "sglang-0.5.17"


def _cmd_status(args: argparse.Namespace) -> int:
    from . import series as series_mod
    from .compat import locate_tree

    tree = locate_tree(args.target)
    print(f"sglang {tree.version or 'unknown'} ({tree.layout} tree) at {tree.package}")
    for name in series_mod.available_series():
        status = series_mod.inspect(tree, series_mod.load_series(name))
        print(f"  {status.line()}")
    return 0


def _cmd_apply(args: argparse.Namespace) -> int:
    from . import series as series_mod
    from .compat import locate_tree

    tree = locate_tree(args.target)
    print(series_mod.apply(tree, series_mod.load_series(args.series)))
    return 0


def _cmd_revert(args: argparse.Namespace) -> int:
    from . import series as series_mod
    from .compat import locate_tree

    tree = locate_tree(args.target)
    names = [args.series] if args.series else series_mod.available_series()
    for name in names:
        series = series_mod.load_series(name)
        if args.series or series_mod.inspect(tree, series).state in (
            series_mod.State.APPLIED,
            series_mod.State.PARTIAL,
        ):
            print(series_mod.revert(tree, series))
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from . import series as series_mod

    written = series_mod.export(Path(args.repo), args.base, args.series, out_dir=args.out and Path(args.out))
    for path in written:
        print(path)
    return 0


def _cmd_base(args: argparse.Namespace) -> int:
    from . import series as series_mod
    from .compat import locate_tree

    print(series_mod.reconstruct_base(locate_tree(args.source), series_mod.load_series(args.series), Path(args.out)))
    return 0


def _cmd_workbench(args: argparse.Namespace) -> int:
    from . import series as series_mod
    from .compat import locate_tree

    base = series_mod.workbench(locate_tree(args.source), series_mod.load_series(args.series), Path(args.repo))
    print(f"{args.repo}: series {args.series} on base commit {base}; after editing, run:")
    print(f"  sglang-dcp-dspark export --repo {args.repo} --base {base} --series {args.series}")
    return 0


def _cmd_coverage(args: argparse.Namespace) -> int:
    from . import hostpool

    from .compat import locate_tree

    tree = locate_tree(None)
    # --draft-path picks the draft paths of PR #35221's form (its parent and 0.5.18).
    build = hostpool.build_pools
    if args.draft_path:
        from . import draft_paths

        build = lambda g: draft_paths.build_pools(args.draft_path, g)  # noqa: E731
    where = f", {args.draft_path} draft path" if args.draft_path else ""
    print(f"draft host pool coverage on {tree.describe()} (real MLA host pools on CPU, layout {args.layout}{where}):")
    print(f"  {'dcp':>3}  {'target rows':>11}  {'logical slots':>13}  {'draft rows':>10}  {'coverage':>8}  {'out of bounds':>13}")
    for dcp in args.dcp:
        pair = build(hostpool.Geometry(dcp, args.layout))
        print(
            f"  {dcp:>3}  {pair.target_host_pool.size:>11}  {pair.target_host_pool.logical_size:>13}  "
            f"{pair.draft_host_pool.size:>10}  {pair.coverage:>8.3f}  {pair.out_of_bounds_slots():>13}"
        )
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-dcp-dspark",
        description="DCP + HiCache + DSPARK for sglang: patch series, plugin and launch preflight.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    target_help = "sglang tree: a source checkout (has python/sglang) or an installed tree (has sglang/); default: the sglang this Python imports"

    p = sub.add_parser("status", help="sglang version and the state of each patch series")
    p.add_argument("--target", metavar="DIR", help=target_help)
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("apply", help="apply a patch series, all or nothing")
    p.add_argument("--target", metavar="DIR", help=target_help)
    p.add_argument("--series", default=DEFAULT_SERIES, metavar="NAME", help=f"default: {DEFAULT_SERIES}")
    p.set_defaults(func=_cmd_apply)

    p = sub.add_parser("revert", help="undo applied patch series, restoring the files byte for byte")
    p.add_argument("--target", metavar="DIR", help=target_help)
    p.add_argument("--series", metavar="NAME", help="default: every series found applied")
    p.set_defaults(func=_cmd_revert)

    p = sub.add_parser("export", help="re-export a series from a working branch, deterministically")
    p.add_argument("--repo", required=True, metavar="DIR", help="git checkout with the series committed on BASE")
    p.add_argument("--base", required=True, metavar="REV", help="the commit the series applies to")
    p.add_argument("--series", default=DEFAULT_SERIES, metavar="NAME")
    p.add_argument("--out", metavar="DIR", help="write here instead of the series directory")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("coverage", help="draft host pool coverage of the logical slot space, on real pools")
    p.add_argument("--dcp", type=int, nargs="+", default=[1, 2, 4, 8], metavar="N")
    p.add_argument("--layout", default="layer_first", choices=["layer_first", "page_first", "page_first_direct"])
    p.add_argument(
        "--draft-path",
        choices=["sidecar", "legacy"],
        help="register the draft through build_full_draft_pools (sidecar) or _register_legacy_hicache_draft "
        "(legacy), as in PR #35221's parent and sglang 0.5.18; default: maybe_register_hicache_draft of 0.5.17",
    )
    p.set_defaults(func=_cmd_coverage)

    p = sub.add_parser("base", help="rebuild the tree a series in upstream's form applies to, from the release that shipped it")
    p.add_argument("--series", required=True, metavar="NAME", help="e.g. upstream-pr-35221")
    p.add_argument("--from", dest="source", required=True, metavar="DIR", help="the release's tree, e.g. from pip install --no-deps --target DIR sglang==0.5.18")
    p.add_argument("--out", required=True, metavar="DIR", help="new directory for the base tree")
    p.set_defaults(func=_cmd_base)

    p = sub.add_parser("workbench", help="a git working branch: the series' base files committed, the series git am'ed on top")
    p.add_argument("--series", required=True, metavar="NAME")
    p.add_argument("--from", dest="source", required=True, metavar="DIR", help="the tree the series applies to (for upstream-pr-35221: the output of base)")
    p.add_argument("--repo", required=True, metavar="DIR", help="new directory for the git repository")
    p.set_defaults(func=_cmd_workbench)

    from . import preflight

    preflight.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except DcpDsparkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
