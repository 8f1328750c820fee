"""Replicated vs sharded HiCache backup of the DSpark draft under DCP, measured on sglang 0.5.23 + upstream-next.

Two measurements per dcp size, both on sglang's own code from the tree on
PYTHONPATH (``build/trees/sglang-0.5.23-next``, whose patches 0005-0007 add
``--hicache-draft-backup {replicated,sharded}``):

1. The data path, run both ways. ``datapath.ranks.run_group`` starts ``dcp``
   real rank processes (a gloo group, sglang's ``GroupCoordinator`` for the
   DCP group, each rank a real ``UnifiedRadixCache`` + ``HostPoolGroup`` with
   the draft as a sidecar) and drives the round trip and the eviction stress,
   checking every rank's target stripe and whole replicated draft byte for
   byte after every load. Both modes run the same default ``Case``. From the
   ranks' reports:

   - ``byte_exact``: every rank of both runs reported ok;
   - ``draft_host_bytes_per_node_*``: the bytes the draft host pools allocated
     (read off their buffers' storages), summed over the group's ranks and
     multiplied by the DCP groups on one node: a node has
     ``ranks_per_node`` = 8 GPUs, so ``dcp_groups_per_node`` = 8 // dcp;
   - ``draft_h2d_bytes_per_rank_*``: draft bytes moved host <-> device, both
     directions, over the whole trace, as the reference copy ops counted them
     (rank 0's when all ranks agree, else the largest);
   - ``allgather_bytes_per_rank``: bytes a rank received from the other
     ranks' stripes in the load-back all-gathers (sharded run);
   - the ratios ``draft_host_bytes_reduction`` (replicated / sharded, per node)
     and ``draft_h2d_reduction`` (replicated / sharded, per rank).

2. What the freed host memory buys at a fixed ``--hicache-size``. For the
   DeepSeek-V3 geometry (61 MLA target layers, kv_lora_rank 512,
   qk_rope_head_dim 64, bf16, and a one-layer DSpark draft of the same
   geometry), rank 0's real sglang pools are built with every tensor on
   torch's "meta" device (nothing is allocated): the target
   ``MLATokenToKVPool`` (``--device-rows`` rows, page 64), the replicated draft
   ``MLATokenToKVPool`` (rows x dcp, page 64 x dcp), then the target host pool
   through ``build_kv_only_stack`` at ``--hicache-size`` (which pays the draft
   sidecar out of the budget) and the draft's through
   ``build_full_draft_pools``, once per mode. ``target_host_rows_*`` are the
   built target host pools' ``.size``, and
   ``target_tokens_gain_at_fixed_budget`` = sharded / replicated - 1.

Exit 0 when every run is byte-exact and the per-node draft host bytes fall by
at least 0.9 x dcp; 1 otherwise, with one line on stderr saying which.

    PYTHONPATH=build/trees/sglang-0.5.23-next:test python bench/sharded_draft.py [--dcp 2 4 8] [--json]

``--gain-dcp 16`` adds gain-only entries (no rank processes: a dcp 16 group
spans two nodes, and 16 processes are slow on a small machine); in the JSON
they carry ``"gain_only": true`` and only the fixed-budget keys.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

from sglang_dcp_dspark.plugin.hooks.common import probing

DCP_SIZES = (2, 4, 8)
MODES = ("replicated", "sharded")
GPUS_PER_NODE = 8  # an HGX node: the per-node figures count 8 // dcp DCP groups

# DeepSeek-V3's MLA geometry (its public config.json: 61 layers, kv_lora_rank 512, qk_rope_head_dim
# 64, which emulation/rank_pools.py builds); the DSpark draft is one layer of the same.
TARGET_LAYERS = 61
DRAFT_LAYERS = 1
HICACHE_SIZE_GB = 100


def default_device_rows() -> int:
    """The project's preflight default: DeepSeek-V3's device KV rows per rank on an 8 x H200 node at dcp 8."""
    from sglang_dcp_dspark.preflight.check import DEFAULT_DEVICE_ROWS

    return DEFAULT_DEVICE_ROWS


# ---------------------------------------------------------------- fixed-budget gain (meta device, one process)


def build_host_pools(dcp: int, draft_backup: str, *, device_rows: int,
                     hicache_size: float = HICACHE_SIZE_GB) -> tuple[object, object]:
    """Rank 0's target and draft host pools, built by sglang as a DSpark + HiCache launch builds them.

    tools/emulation/rank_pools.py drives sglang's own build_kv_only_stack (the
    --hicache-size split) and build_full_draft_pools on meta-device pools, so a
    full-scale rank allocates nothing.
    """
    from emulation import rank_pools as pools

    rank = pools.Rank(dcp_size=dcp, device_rows=device_rows, target_layers=TARGET_LAYERS,
                      draft_layers=DRAFT_LAYERS, hicache_size=hicache_size, draft_backup=draft_backup)
    with pools.on_rank(rank):
        built = pools.build(rank)
    return built.target_host, built.draft_host


def fixed_budget_gain(dcp: int, *, device_rows: int | None = None, hicache_size: float = HICACHE_SIZE_GB) -> dict:
    """Target host rows per rank at one ``--hicache-size``, replicated vs sharded draft backup, and the gain."""
    device_rows = default_device_rows() if device_rows is None else device_rows
    rows = {}
    with probing():  # sglang logs each pool it builds; the bench prints its own figures
        for mode in MODES:
            target_host, draft_host = build_host_pools(dcp, mode, device_rows=device_rows, hicache_size=hicache_size)
            rows[mode] = (target_host.size, draft_host.size)
    (t_rep, d_rep), (t_sh, d_sh) = rows["replicated"], rows["sharded"]
    return {
        "target_host_rows_replicated": t_rep,
        "target_host_rows_sharded": t_sh,
        # Per rank a target host row holds one token of this rank's stripe either way, so rows are tokens.
        "target_tokens_gain_at_fixed_budget": t_sh / t_rep - 1,
        "draft_host_rows_at_budget_replicated": d_rep,
        "draft_host_rows_at_budget_sharded": d_sh,
    }


# ---------------------------------------------------------------- the data path (rank processes)


def _per_rank(results: list[dict], key: str) -> tuple[int, bool]:
    """Rank 0's figure and whether every rank agrees; the largest when they do not."""
    values = [r[key] for r in results]
    agree = all(v == values[0] for v in values)
    return (values[0] if agree else max(values)), agree


def measure_group(dcp: int, *, timeout: float) -> dict:
    """Run one DCP group both ways through the real data path; the measured figures."""
    from emulation.datapath import ranks

    runs = {mode: _with_scenario_sums(ranks.run_group(dcp, draft_backup=mode, timeout=timeout)) for mode in MODES}
    groups_per_node = GPUS_PER_NODE // dcp
    out: dict = {"dcp": dcp, "ranks_per_node": GPUS_PER_NODE, "dcp_groups_per_node": groups_per_node}
    # ok means the rank ran both scenarios and its device KV matched the oracle after every load.
    out["byte_exact"] = all(r["ok"] for mode in MODES for r in runs[mode])
    out["byte_exact_replicated"] = all(r["ok"] for r in runs["replicated"])
    out["byte_exact_sharded"] = all(r["ok"] for r in runs["sharded"])
    out["errors"] = [f"{mode} rank {r['rank']}: {r['error']}" for mode in MODES for r in runs[mode] if not r["ok"]]
    agree = {}
    for mode in MODES:
        results = runs[mode]
        # Each rank reports its own pool; a group's host memory is every rank's, a node's every group's.
        out[f"draft_host_bytes_per_node_{mode}"] = sum(r["draft_host_bytes"] for r in results) * groups_per_node
        out[f"draft_h2d_bytes_per_rank_{mode}"], agree[f"draft_h2d_{mode}"] = _per_rank(results, "draft_h2d_bytes")
        out[f"draft_host_rows_per_rank_{mode}"], agree[f"draft_host_rows_{mode}"] = _per_rank(
            results, "draft_host_rows")
        out[f"target_host_rows_per_rank_{mode}"], agree[f"target_host_rows_{mode}"] = _per_rank(
            results, "target_host_rows")
        out[f"tokens_checked_per_rank_{mode}"], agree[f"tokens_checked_{mode}"] = _per_rank(
            results, "tokens_checked")
        out[f"load_backs_per_rank_{mode}"], agree[f"load_backs_{mode}"] = _per_rank(results, "load_backs")
    out["allgather_bytes_per_rank"], agree["allgather_bytes"] = _per_rank(runs["sharded"], "allgather_bytes")
    out["allgathers_per_rank"], agree["allgathers"] = _per_rank(runs["sharded"], "allgathers")
    # The ranks run the same trace, so every per-rank figure should be the same on each; say where not.
    out["ranks_disagree_on"] = sorted(k for k, same in agree.items() if not same)
    out["draft_host_bytes_reduction"] = _ratio(out["draft_host_bytes_per_node_replicated"],
                                               out["draft_host_bytes_per_node_sharded"])
    out["draft_h2d_reduction"] = _ratio(out["draft_h2d_bytes_per_rank_replicated"],
                                        out["draft_h2d_bytes_per_rank_sharded"])
    return out


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def _with_scenario_sums(results: list[dict]) -> list[dict]:
    """Each rank's counts summed over the scenarios, next to its own figures."""
    for r in results:
        counts = r.get("counts") or {}
        for key in ("tokens_checked", "load_backs"):
            r[key] = sum(c.get(key, 0) for c in counts.values())
    return results


# ---------------------------------------------------------------- output


def _fmt_bytes(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def render_table(entries: list[dict]) -> str:
    head = ("dcp", "byte-exact", "draft host B/node repl", "sharded", "cut", "draft h2d B/rank repl", "sharded",
            "cut", "all-gather B/rank", f"target host rows @{HICACHE_SIZE_GB}GB repl", "sharded", "gain")
    lines = []
    for e in entries:
        gain = (f"{e['target_host_rows_replicated']:,}", f"{e['target_host_rows_sharded']:,}",
                f"{100 * e['target_tokens_gain_at_fixed_budget']:+.1f}%")
        if e.get("gain_only"):
            lines.append((str(e["dcp"]), "(gain only)", *["-"] * 7, *gain))
            continue
        lines.append((
            str(e["dcp"]), "yes" if e["byte_exact"] else "NO",
            _fmt_bytes(e["draft_host_bytes_per_node_replicated"]), _fmt_bytes(e["draft_host_bytes_per_node_sharded"]),
            _fmt_ratio(e["draft_host_bytes_reduction"]),
            _fmt_bytes(e["draft_h2d_bytes_per_rank_replicated"]), _fmt_bytes(e["draft_h2d_bytes_per_rank_sharded"]),
            _fmt_ratio(e["draft_h2d_reduction"]), _fmt_bytes(e["allgather_bytes_per_rank"]), *gain,
        ))
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in lines)])


def verdict(entries: list[dict]) -> list[str]:
    """Why the run fails, one reason per dcp; empty when it passes."""
    reasons = []
    for e in entries:
        if e.get("gain_only"):
            continue
        if not e["byte_exact"]:
            reasons.append(f"dcp {e['dcp']} not byte-exact ({'; '.join(e['errors'])})")
        cut = e["draft_host_bytes_reduction"]
        if cut is None or cut < 0.9 * e["dcp"]:
            reasons.append(f"dcp {e['dcp']} draft host bytes per node fell {_fmt_ratio(cut)}, "
                           f"under 0.9 x dcp = {0.9 * e['dcp']:.1f}x")
    return reasons


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dcp", type=int, nargs="+", default=list(DCP_SIZES),
                        help="dcp sizes to run both ways, each dividing 8 (default 2 4 8)")
    parser.add_argument("--gain-dcp", type=int, nargs="*", default=[],
                        help="extra dcp sizes for the fixed-budget gain only, no rank processes (e.g. 16)")
    parser.add_argument("--device-rows", type=int, default=None,
                        help="target device rows per rank for the gain (default: preflight's, 540000)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds one group of rank processes may take (default 600: 8 ranks on 2 cores)")
    parser.add_argument("--json", action="store_true", help="print a JSON list, one object per dcp")
    args = parser.parse_args(argv)
    bad = [d for d in args.dcp if d < 2 or GPUS_PER_NODE % d]
    if bad:
        parser.error(f"--dcp {bad}: a DCP group here is 2 or more ranks of one {GPUS_PER_NODE}-GPU node")

    # sglang's import warns about CUDA-only kernels on a CPU machine; none of them is used here.
    warnings.filterwarnings("ignore", category=UserWarning)
    started = time.perf_counter()
    entries = []
    for dcp in args.dcp:
        entry = measure_group(dcp, timeout=args.timeout)
        entry.update(fixed_budget_gain(dcp, device_rows=args.device_rows))
        entries.append(entry)
    for dcp in args.gain_dcp:
        entries.append({"dcp": dcp, "gain_only": True, **fixed_budget_gain(dcp, device_rows=args.device_rows)})
    elapsed = time.perf_counter() - started

    if args.json:
        print(json.dumps(entries, indent=1))
    else:
        rows = default_device_rows() if args.device_rows is None else args.device_rows
        print(f"draft host bytes: allocated by the draft host pools, summed over a DCP group's ranks x (8 // dcp) "
              f"groups per 8-GPU node; draft h2d: draft bytes host<->device per rank over the trace; "
              f"target host rows: DeepSeek-V3 rank 0 at --hicache-size {HICACHE_SIZE_GB}, {rows:,} device rows")
        print()
        print(render_table(entries))
        print()
        print(f"measured in {elapsed:.1f} s")
    reasons = verdict(entries)
    if reasons:
        print("FAIL: " + "; ".join(reasons), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
