"""``coverage``: how much of the target's logical slot space the draft host pool covers, on real pools."""

from __future__ import annotations

import argparse

from ..core.compat import locate_tree


def add_parser(sub) -> None:
    p = sub.add_parser("coverage", help="draft host pool coverage of the logical slot space, on real pools")
    p.add_argument("--dcp", type=int, nargs="+", default=[1, 2, 4, 8], metavar="N")
    p.add_argument("--layout", default="layer_first", choices=["layer_first", "page_first", "page_first_direct"])
    p.add_argument(
        "--draft-path",
        choices=["sidecar", "legacy"],
        help="register the draft through build_full_draft_pools (sidecar) or _register_legacy_hicache_draft "
        "(legacy), as in PR #35221's parent and sglang 0.5.18; default: maybe_register_hicache_draft of 0.5.17",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: the pool builders import sglang and torch, which take seconds.
    from ..core import probes

    tree = locate_tree(None)
    # --draft-path picks the draft paths of PR #35221's form (its parent and 0.5.18).
    if args.draft_path:
        from ..preflight import draft_paths

        def build(geometry):
            return draft_paths.build_pools(args.draft_path, geometry)
    else:
        build = probes.build_pools
    where = f", {args.draft_path} draft path" if args.draft_path else ""
    print(f"draft host pool coverage on {tree.describe()} (real MLA host pools on CPU, layout {args.layout}{where}):")
    print(f"  {'dcp':>3}  {'target rows':>11}  {'logical slots':>13}  {'draft rows':>10}  {'coverage':>8}  {'out of bounds':>13}")
    for dcp in args.dcp:
        pair = build(probes.Geometry(dcp, args.layout))
        print(
            f"  {dcp:>3}  {pair.target_host_pool.size:>11}  {pair.target_host_pool.logical_size:>13}  "
            f"{pair.draft_host_pool.size:>10}  {pair.coverage:>8.3f}  {pair.out_of_bounds_slots():>13}"
        )
    return 0
