"""Pinned HiCache host memory per rank and per node under DCP with a DSPARK draft, three ways.

For each MLA geometry and dcp size, rank 0's target and draft host pools are
built by sglang's own classes (``MLATokenToKVPool`` / ``MLATokenToKVPoolHost``,
full size, tensors on the "meta" device so nothing is allocated) through
:func:`measure` here, and the draft is registered by the
installed sglang's own ``maybe_register_hicache_draft``:

- ``stock-0.5.17``: target at ``--hicache-size``, draft registered as stock
  0.5.17 does (rows from the target's physical rows: covers 1/dcp of the
  logical slots, the rest are out-of-bounds writes);
- ``0.5.18+``: target at ``--hicache-size``, draft from ``logical_size`` (the
  plugin's fix, which is the same rule 0.5.18 uses); nothing counts the draft
  in the budget;
- ``this-project``: the target gets t / (t + dcp * d) of ``--hicache-size``
  (``rules.BudgetSplit``, as the plugin and series patch 0004 apply it),
  draft from ``logical_size``.

    python bench/host_memory.py [--hicache-size GB] [--device-rows N] [--markdown | --json]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from sglang_dcp_dspark.core import meta, pools, probes, rules, sizing
from sglang_dcp_dspark.plugin.hooks import common as hook_common
from sglang_dcp_dspark.plugin.hooks import kv_cache_builder as kv_cache_hooks

GB = rules.GB  # --hicache-size is decimal GB (HostKVCache: host_size * 1e9), so every figure here is too
DCP_SIZES = (1, 2, 4, 8, 16)
GPUS_PER_NODE = 8
SETUPS = ("stock-0.5.17", "0.5.18+", "this-project")


@dataclass(frozen=True)
class Model:
    name: str
    source: str
    target: sizing.MLAKV
    draft: sizing.MLAKV


# Both from the models' public config.json (num_hidden_layers, kv_lora_rank,
# qk_rope_head_dim); the draft is one layer of the same MLA geometry, a NextN
# layer's shape: a stand-in for the budget arithmetic (DSPARK's shipped drafts
# are dense; preflight sizes those, docs/host-memory.md says so).
MODELS = (
    Model("DeepSeek-V3", "https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json",
          sizing.MLAKV(61, 512, 64), sizing.MLAKV(1, 512, 64)),
    Model("DeepSeek-V2-Lite", "https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json",
          sizing.MLAKV(27, 512, 64), sizing.MLAKV(1, 512, 64)),
)


@dataclass(frozen=True)
class Row:
    """One setup at one dcp size, rank 0's pools."""

    model: str
    dcp: int
    setup: str
    target_rows: int
    logical_slots: int
    draft_rows: int
    target_bytes: int
    draft_bytes: int
    per_rank_bytes: int
    ranks_per_node: int
    per_node_bytes: int
    coverage: float  # draft rows / target logical slots; < 1 means out-of-bounds draft writes
    budget_bytes: int  # --hicache-size per rank
    fits_budget: bool

    @property
    def draft_share(self) -> float:
        return self.draft_bytes / self.per_rank_bytes


def registrations() -> tuple[Callable, Callable]:
    """The installed sglang's draft registration as shipped, and the same with the plugin's fix around it."""
    from sglang.srt.mem_cache import kv_cache_builder


    # unwrap: if anything hooked the function in this process, measure the shipped one.
    stock = inspect.unwrap(kv_cache_builder.maybe_register_hicache_draft)
    verdict = kv_cache_hooks.registration_verdict(stock)
    if verdict.verdict is not hook_common.Verdict.NEEDS_FIX:
        # The "stock-0.5.17" column means nothing on a tree that is already fixed.
        raise SystemExit(f"host_memory: the installed registration is not stock 0.5.17's: {verdict}")
    return stock, kv_cache_hooks.fixed_registration(stock)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """sglang warns per pool (e.g. host smaller than device) and the fix logs what it pins; keep the table clean."""
    root = logging.getLogger()
    saved = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(saved)


def launch_tp(dcp: int) -> int:
    # The launch is tp = max(8, dcp) over whole 8-GPU nodes (dcp divides tp).
    return max(GPUS_PER_NODE, dcp)


def ranks_per_node(dcp: int) -> int:
    """Ranks per node of the launch at this dcp: every rank pins its own host pools."""
    tp = launch_tp(dcp)
    return rules.ranks_per_node(tp, 1, rules.nodes_needed(tp, 1, GPUS_PER_NODE))


def measure(target_kv: sizing.MLAKV, draft_kv: sizing.MLAKV | None, *, dcp_size: int, device_rows: int,
            page_size: int, hicache_ratio: float, hicache_size_gb: float = 0, layout: str = "layer_first",
            register_stock: Callable | None = None, register_fixed: Callable | None = None) -> sizing.HiCacheSizing:
    """Build rank 0's pools at full size on the meta device and register the draft both ways."""
    geometry = probes.Geometry(dcp_size, layout, device_rows=device_rows, page_size=page_size,
                               host_ratio=hicache_ratio, hicache_size_gb=hicache_size_gb)
    with meta.unallocated_host_buffers():
        target_device = pools.device_pool(target_kv, device_rows, page_size, meta=True)
        target_pool = probes.build_target_host_pool(geometry, device_pool=target_device)
        drafts = []
        for register in (register_stock, register_fixed):
            if draft_kv is None or register is None:
                drafts.append(None)
                continue
            # The replicated draft is indexed by logical slots: its device pool has device_rows x dcp rows.
            draft_device = pools.device_pool(draft_kv, device_rows * dcp_size, page_size * dcp_size, meta=True)
            kwargs = probes.draft_registration_args(target_pool, geometry, draft_device_pool=draft_device)
            register(**kwargs)
            draft = kwargs["tree_cache"].cache_controller.mem_pool_host_draft
            drafts.append(None if draft is None else sizing.HostPoolSize.of(draft))
    return sizing.HiCacheSizing(dcp_size, page_size, device_rows, sizing.HostPoolSize.of(target_pool), drafts[0],
                                drafts[1])


def measure_case(model: Model, dcp: int, *, budget_gb: float, device_rows: int, page_size: int,
                 stock: Callable, fixed: Callable) -> list[Row]:
    budget = int(budget_gb * GB)
    common = dict(dcp_size=dcp, device_rows=device_rows, page_size=page_size, hicache_ratio=2.0)
    # Stock 0.5.17 and 0.5.18+ share the target pool at the full budget; only the draft registration differs.
    full = measure(model.target, model.draft, hicache_size_gb=budget_gb,
                          register_stock=stock, register_fixed=fixed, **common)
    # The split takes bytes per token from the host pools sglang just built, as the plugin does from the
    # same host-pool classes at startup.
    split = rules.BudgetSplit(budget, full.target.bytes_per_token, full.draft_fixed.bytes_per_token, dcp, page_size)
    ours = measure(model.target, model.draft, hicache_size_gb=split.target_hicache_size_gb,
                          register_fixed=fixed, **common)
    rows = []
    for setup, m, draft in (("stock-0.5.17", full, full.draft_stock), ("0.5.18+", full, full.draft_fixed),
                            ("this-project", ours, ours.draft_fixed)):
        per_rank = m.target.bytes + draft.bytes
        rpn = ranks_per_node(dcp)
        rows.append(Row(model.name, dcp, setup, m.target.rows, m.target.logical_slots, draft.rows, m.target.bytes,
                        draft.bytes, per_rank, rpn, rules.per_node(per_rank, rpn), m.coverage(draft), budget,
                        per_rank <= budget))
    return rows


def issue_example(stock: Callable, fixed: Callable) -> dict:
    """The issue's example: ~1M target host rows per rank at dcp 8 (DeepSeek-V3, --hicache-ratio 2)."""
    model = MODELS[0]
    m = measure(model.target, model.draft, dcp_size=8, device_rows=500_000, page_size=64, hicache_ratio=2.0,
                       register_stock=stock, register_fixed=fixed)
    return {"target_rows": m.target.rows, "draft_rows_stock": m.draft_stock.rows,
            "draft_bytes_stock": m.draft_stock.bytes, "draft_rows_fixed": m.draft_fixed.rows,
            "draft_bytes_fixed": m.draft_fixed.bytes}


def _gb(n: int) -> str:
    return f"{n / GB:.2f}"


COLUMNS = ("dcp", "setup", "target rows", "logical slots", "draft rows", "coverage", "target GB", "draft GB",
           "per rank GB", "per node GB", "draft share", "within budget")


def _cells(r: Row) -> list[str]:
    verdict = "yes" if r.fits_budget else f"no (+{_gb(r.per_rank_bytes - r.budget_bytes)})"
    return [str(r.dcp), r.setup, f"{r.target_rows:,}", f"{r.logical_slots:,}", f"{r.draft_rows:,}",
            f"{r.coverage:.3f}", _gb(r.target_bytes), _gb(r.draft_bytes), _gb(r.per_rank_bytes),
            _gb(r.per_node_bytes), f"{r.draft_share:.1%}", verdict]


def render_text(rows: list[Row], table: Callable[[list[list[str]]], str]) -> str:
    out = []
    for model in MODELS:
        mine = [r for r in rows if r.model == model.name]
        if not mine:
            continue
        t = model.target
        name = f"**{model.name}**" if table is markdown_table else model.name
        out.append(f"{name}: {t.layers} layers x (kv_lora_rank {t.kv_lora_rank} + rope {t.qk_rope_head_dim}) "
                   f"{t.dtype}, draft {model.draft.layers} layer; config: {model.source}")
        if table is markdown_table:
            out.append("")  # a markdown table must not continue the paragraph above it
        out.append(table([list(COLUMNS)] + [_cells(r) for r in mine]))
        out.append("")
    return "\n".join(out)


def plain_table(cells: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.rjust(w) if i != 1 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(cells: list[list[str]]) -> str:
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("---" for _ in cells[0]) + "|")
    return "\n".join(lines)


def ratios(rows: list[Row]) -> str:
    """Ratios between the setups, all from this run's figures."""
    out = ["ratios (same run):"]
    for model in MODELS:
        by = {(r.dcp, r.setup): r for r in rows if r.model == model.name}
        for dcp in sorted({d for d, _ in by}):
            s, n, p = (by[(dcp, x)] for x in SETUPS)
            out.append(
                f"  {model.name:<16} dcp {dcp:>2}: 0.5.18+ pins {n.per_rank_bytes / n.budget_bytes:.3f}x the budget "
                f"(draft {n.draft_share:.1%} of it), stock draft is {s.draft_bytes / n.draft_bytes:.3f}x the covering "
                f"one; this project pins {p.per_rank_bytes / p.budget_bytes:.4f}x the budget (draft "
                f"{p.draft_share:.1%}) with {p.target_rows / n.target_rows:.3f}x 0.5.18+'s target rows")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hicache-size", type=float, default=100.0, help="--hicache-size per rank, GB (default 100)")
    parser.add_argument("--device-rows", type=int, default=400_000,
                        help="target device KV pool rows per rank (default 400000)")
    parser.add_argument("--page-size", type=int, default=64, help="--page-size, physical per rank (default 64)")
    parser.add_argument("--dcp", type=int, nargs="+", default=list(DCP_SIZES), help="dcp sizes (default 1 2 4 8 16)")
    parser.add_argument("--model", choices=[m.name for m in MODELS], nargs="+", default=[m.name for m in MODELS])
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="print the tables as in docs/host-memory.md")
    fmt.add_argument("--json", action="store_true", help="print every figure as JSON")
    args = parser.parse_args(argv)

    # sglang's import warns about CUDA-only kernels on a CPU machine; none of them is used here.
    warnings.filterwarnings("ignore", category=UserWarning)
    started = time.perf_counter()
    stock, fixed = registrations()
    rows: list[Row] = []
    with quiet():
        for model in (m for m in MODELS if m.name in args.model):
            for dcp in args.dcp:
                rows += measure_case(model, dcp, budget_gb=args.hicache_size, device_rows=args.device_rows,
                                     page_size=args.page_size, stock=stock, fixed=fixed)
        example = issue_example(stock, fixed)
    elapsed = time.perf_counter() - started

    params = {"hicache_size_gb": args.hicache_size, "device_rows_per_rank": args.device_rows,
              "page_size": args.page_size, "gpus_per_node": GPUS_PER_NODE}
    if args.json:
        print(json.dumps({"parameters": params, "models": [{"name": m.name, "source": m.source,
                                                             "target": asdict(m.target), "draft": asdict(m.draft)}
                                                            for m in MODELS],
                          "rows": [{**asdict(r), "draft_share": r.draft_share} for r in rows],
                          "issue_example": example}, indent=2))
        return 0
    print(f"--hicache-size {args.hicache_size:g} GB per rank, {args.device_rows:,} target device rows per rank, "
          f"page {args.page_size} per rank (logical page {args.page_size} x dcp), {GPUS_PER_NODE} ranks per node "
          f"(tp = max(8, dcp)); GB = 1e9 bytes; coverage = draft rows / target logical slots")
    print()
    print(render_text(rows, markdown_table if args.markdown else plain_table))
    if not args.markdown:
        print(ratios(rows))
        print()
    print(f"issue example (DeepSeek-V3, dcp 8, 500,000 device rows, --hicache-ratio 2): target "
          f"{example['target_rows']:,} host rows; draft stock {example['draft_rows_stock']:,} rows = "
          f"{_gb(example['draft_bytes_stock'])} GB, draft fixed {example['draft_rows_fixed']:,} rows = "
          f"{_gb(example['draft_bytes_fixed'])} GB per rank")
    if not args.markdown:
        print(f"measured in {elapsed:.1f} s (after imports)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
