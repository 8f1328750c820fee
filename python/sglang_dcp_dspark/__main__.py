"""Command line: ``sglang-dcp-dspark <command>``; every command returns an exit code.

Exit codes: 0 done; 1 ``preflight``: sglang rejects the launch; 2 refused or
failed, with one ``error:`` line on stderr and the sglang tree unchanged (or
put back whole); 130 / 143 interrupted by SIGINT / SIGTERM, likewise with the
tree unchanged or put back whole; 141 stdout was closed early (``| head``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from . import __version__
from .errors import DcpDsparkError, Interrupted

DEFAULT_SERIES = "sglang-0.5.17"


def _cmd_status(args: argparse.Namespace) -> int:
    from . import series as series_mod
    from .compat import locate_tree

    tree = locate_tree(args.target)
    _print_note(series_mod.recover(tree))
    print(f"sglang {tree.version or 'unknown'} ({tree.layout} tree) at {tree.package}")
    statuses = [series_mod.inspect(tree, series_mod.load_series(name)) for name in series_mod.available_series()]
    # The plugin first: where it fixes the tree at run time, an "applicable" series is not needed.
    from .plugin import status_line

    print(f"  {status_line(tree.version, statuses)}")
    for status in statuses:
        print(f"  {status.line()}")
    return 0


def _print_note(note: str | None) -> None:
    """A recovery line goes to stderr, so stdout stays what the command itself reports."""
    if note:
        print(note, file=sys.stderr)


def _chosen_series(args: argparse.Namespace, default: str | None):
    """--series names one of the package's own series; only --series-dir reads a directory."""
    from . import series as series_mod

    if args.series_dir:
        if args.series:
            raise DcpDsparkError("--series and --series-dir name a series twice; expected one of them; fix: drop one")
        return series_mod.load_series_dir(args.series_dir)
    name = args.series or default
    return series_mod.load_series(name) if name else None


def _cmd_apply(args: argparse.Namespace) -> int:
    from . import series as series_mod
    from .compat import locate_tree

    tree = locate_tree(args.target)
    series = _chosen_series(args, DEFAULT_SERIES)
    lines = series_mod.apply(tree, series).splitlines()
    _print_note("\n".join(lines[:-1]) or None)
    print(lines[-1])
    return 0


def _cmd_revert(args: argparse.Namespace) -> int:
    from . import series as series_mod
    from .compat import locate_tree

    tree = locate_tree(args.target)
    chosen = _chosen_series(args, None)
    if chosen is not None:
        lines = series_mod.revert(tree, chosen).splitlines()
        _print_note("\n".join(lines[:-1]) or None)
        print(lines[-1])
        return 0
    # Every series found in the tree; a series meant for this release whose
    # files match neither side is an error, not something to skip in silence.
    _print_note(series_mod.recover(tree, action="revert"))
    reverted, conflicts = 0, []
    for name in series_mod.available_series():
        series = series_mod.load_series(name)
        status = series_mod.inspect(tree, series)
        if status.state in (series_mod.State.APPLIED, series_mod.State.PARTIAL) or status.recorded:
            print(series_mod.revert(tree, series))
            reverted += 1
        elif status.state is series_mod.State.CONFLICT and series.targets(tree.version):
            conflicts.append(series)
    if conflicts:
        names = ", ".join(s.name for s in conflicts)
        raise DcpDsparkError(
            f"{names} cannot be reverted from {tree.describe()}: its files match neither the stock nor the "
            f"patched sources{'; ' + str(reverted) + ' other series reverted' if reverted else ''}; "
            f"fix: {tree.restore_hint(str(conflicts[0].applies_to))}"
        )
    if not reverted:
        print(f"nothing to revert: no series is applied to {tree.describe()}")
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

    series_dir_help = "a series directory outside the package (its series file and patches); instead of --series"

    p = sub.add_parser("apply", help="apply a patch series, all or nothing, even if killed")
    p.add_argument("--target", metavar="DIR", help=target_help)
    p.add_argument("--series", metavar="NAME", help=f"a series of the package's patches/; default: {DEFAULT_SERIES}")
    p.add_argument("--series-dir", metavar="DIR", help=series_dir_help)
    p.set_defaults(func=_cmd_apply)

    p = sub.add_parser("revert", help="undo applied patch series, restoring the files byte for byte")
    p.add_argument("--target", metavar="DIR", help=target_help)
    p.add_argument("--series", metavar="NAME", help="default: every series found applied")
    p.add_argument("--series-dir", metavar="DIR", help=series_dir_help)
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


def _raise_interrupted(signum, frame) -> None:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
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
        return 2
    finally:
        for signum, old in handlers.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
