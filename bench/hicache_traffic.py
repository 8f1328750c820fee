"""HiCache host<->device traffic per token, target and draft, per rank and per DCP group, counted in a real run.

Each dcp size runs the data-path harness's round trip (test/datapath: sglang's
real HiRadixCache, HiCacheController, host pools and draft registration) with
the DeepSeek-V3 KV geometry, and reads the bytes that the reference transfer
ops moved between each device pool and its host pool. Nothing is computed from
a formula: a change in what sglang copies shows up here. It is the baseline for
sharding the draft backup across DCP ranks.

A "DCP group" is the dcp ranks that together hold one sequence's KV (at dcp 16
that is two 8-GPU nodes). Every rank moves the same bytes: its stripe of the
target and the whole replicated draft.

Run it on a tree with the fix (the stock 0.5.17 draft host pool overflows at dcp > 1):
    PYTHONPATH=build/trees/sglang-0.5.17-patched .venv/bin/python bench/hicache_traffic.py [--json]
    .venv/bin/python bench/hicache_traffic.py --plugin   # stock 0.5.17 with the installed plugin loaded
"""

from __future__ import annotations

import argparse
import json
import sys

DCP_SIZES = (1, 2, 4, 8, 16)
# DeepSeek-V3: MLA latent 512 + rope 64 in bf16 (1,152 bytes per token per layer); 61 layers; one MTP/draft layer.
GEOMETRY = dict(kv_lora_rank=512, qk_rope_head_dim=64, target_layers=61, draft_layers=1)


def measure(dcp: int, *, target_layers: int, page_size: int, device_pages: int) -> dict:
    from emulation.datapath import scenarios
    from emulation.datapath.harness import DRAFT, TARGET, Case
    from emulation.datapath.substitutions import ReferenceOps

    case = Case(
        dcp_size=dcp, dcp_rank=dcp - 1, layout="layer_first", io_backend="kernel", draft="mla",
        page_size=page_size, device_pages=device_pages,
        **{**GEOMETRY, "target_layers": target_layers},
    )
    ops = ReferenceOps()
    counts = scenarios.round_trip(case, ops=ops)
    row = {"dcp": dcp, "tokens_backed_up": counts.tokens_written, "tokens_loaded": counts.tokens_loaded,
           "target_layers": case.target_layers, "draft_layers": case.draft_layers}
    for who in (TARGET, DRAFT):
        backup = ops.bytes_between(f"{who}/device", f"{who}/host")
        load = ops.bytes_between(f"{who}/host", f"{who}/device")
        row[f"{who}_backup_per_token_rank"] = backup / counts.tokens_written
        row[f"{who}_load_per_token_rank"] = load / counts.tokens_loaded
        row[f"{who}_backup_per_token_group"] = dcp * backup / counts.tokens_written
        row[f"{who}_load_per_token_group"] = dcp * load / counts.tokens_loaded
    return row


def table(rows: list[dict]) -> str:
    head = ("| dcp | target backup B/token: rank / group | draft backup B/token: rank / group "
            "| target load B/token: rank / group | draft load B/token: rank / group | draft share of group backup |")
    out = [head, "|---|---|---|---|---|---|"]

    def cell(r: dict, k: str) -> str:
        return f"{r[k + '_per_token_rank']:,.0f} / {r[k + '_per_token_group']:,.0f}"

    for r in rows:
        share = r["draft_backup_per_token_group"] / (r["draft_backup_per_token_group"] + r["target_backup_per_token_group"])
        out.append(f"| {r['dcp']} | {cell(r, 'target_backup')} | {cell(r, 'draft_backup')} | {cell(r, 'target_load')} "
                   f"| {cell(r, 'draft_load')} | {share:.1%} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    parser.add_argument("--plugin", action="store_true", help="load installed sglang plugins first (stock 0.5.17 + this plugin)")
    parser.add_argument("--target-layers", type=int, default=GEOMETRY["target_layers"],
                        help="fewer target layers run faster; per-token target bytes scale with this")
    parser.add_argument("--dcp", type=int, nargs="*", default=list(DCP_SIZES))
    parser.add_argument("--page-size", type=int, default=16, help="physical page per rank (tokens)")
    parser.add_argument("--device-pages", type=int, default=32, help="target device pages per rank")
    args = parser.parse_args(argv)
    if args.plugin:
        from sglang.srt.mem_cache import kv_cache_builder  # noqa: F401 - imported first, as a scheduler does
        from sglang.srt.plugins import load_plugins

        load_plugins()
    from emulation.datapath.harness import DraftHostOverflow, sglang_version

    try:
        rows = [measure(d, target_layers=args.target_layers, page_size=args.page_size,
                        device_pages=args.device_pages) for d in args.dcp]
    except DraftHostOverflow as exc:
        print(f"hicache_traffic: {exc}; expected a tree with the fix; fix: PYTHONPATH=build/trees/"
              "sglang-0.5.17-patched or --plugin", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"sglang": sglang_version(), "geometry": {**GEOMETRY, "target_layers": args.target_layers},
                          "rows": rows}, indent=2))
    else:
        print(f"sglang {sglang_version()}; MLA 512+64 bf16, {args.target_layers} target layers, "
              f"{GEOMETRY['draft_layers']} draft layer; bytes counted in the reference transfer ops")
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
