"""What one verify step under DCP costs to plan: the per-row design (before) beside the split one (now), one run.

For each shape (batch x committed context, DSPARK block 7 or EAGLE chain 4, at
dcp 8) both designs plan the same verify batch on the host lengths and build
their ids for the kernel. Per step it prints:

- ``KV x``: KV tokens handed to the kernel over all 8 ranks' plans, filler
  slots included, over the tokens the ranks hold (each position sits on one
  rank). It is the attention kernel's KV reads relative to what a decode over
  the same tokens reads; HBM traffic itself needs a GPU;
- ``host elems`` and ``H2D``: the elements the plan makes on the host, and
  the bytes it copies to the device (what flashinfer's ``plan()`` copies of
  the host arrays it is handed included), for one rank;
- ``host ms``: one rank's planning on the host (median of the repeats);
- ``dev ms``: its device work (the id gathers), timed apart. On a machine
  without a GPU that runs on the CPU: torch's gather for the per-row design,
  sglang's Triton index builder in Triton's interpreter for the split one,
  so the figure is for information only and is not a GPU's;
- ``graph MB``: the CUDA-graph buffers the design adds to stock's for the
  verify, at ``max_bs = batch`` and ``context_len = context``, against stock's
  own decode buffers (``cuda_graph_kv_indices``, ``max_bs x context_len``
  int32), which the split design's prefix side reuses.

The last lines check the two claims the design makes: at batch 32 the split's
host planning grows at most 1.5x from 4K to 128K context, and its host-to-device
bytes do not grow with context at all.

    PYTHONPATH=build/trees/sglang-0.5.23 python bench/verify_cost.py [--smoke] [--json]

``--smoke`` runs the smallest shape only, once. Needs a tree with sglang's DCP
index builder (0.5.20 and later); Triton's interpreter is turned on here.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

DCP = 8
BATCHES = (1, 8, 32, 64)
CONTEXTS = (4096, 32768, 131072)
DRAFTS = (("DSPARK", 7), ("EAGLE", 4))
GROWTH_BOUND = 1.5  # the split's host planning at batch 32, 128K over 4K context
SPLIT_REPEATS = 101
MB = 1e6


# ---------------------------------------------------------------- the per-row design, as it was before the split


def per_row_plan(qo_indptr, kv_indptr, dcp_size: int, dcp_rank: int):
    """The per-row plan 0012 and the plugin shipped before the split: one row per draft token over every key of
    this rank up to the token's position, the gather built on the host (one int64 per row and key)."""
    import torch

    from sglang_dcp_dspark.plugin.dcp_verify import owned_count

    qo, kv = qo_indptr.to(torch.int64), kv_indptr.to(torch.int64)
    q_len, kv_len = qo[1:] - qo[:-1], kv[1:] - kv[:-1]
    request = torch.repeat_interleave(torch.arange(len(q_len)), q_len)
    j = torch.arange(int(q_len.sum())) - torch.repeat_interleave(qo[:-1], q_len)
    count = owned_count((kv_len - q_len)[request] + j + 1, dcp_size, dcp_rank)
    slots = torch.clamp(count, min=1)
    row_of = torch.repeat_interleave(torch.arange(len(slots)), slots)
    first = torch.zeros(len(slots) + 1, dtype=torch.int64)
    first[1:] = torch.cumsum(slots, 0)
    k = torch.arange(int(first[-1])) - first[:-1][row_of]
    gather = kv[:-1][request][row_of] + dcp_rank + dcp_size * k
    gather = torch.where(count[row_of] > 0, gather, torch.full_like(gather, -1))
    rows = SimpleNamespace(qo_indptr=torch.arange(len(slots) + 1, dtype=torch.int32), kv_indptr=first.to(torch.int32),
                           kv_len=slots.to(torch.int32), gather=gather, empty=count == 0)
    rows.host_elements = sum(t.numel() for t in (rows.qo_indptr, rows.kv_indptr, rows.kv_len, rows.gather, rows.empty))
    # The gather and the empty flags go to the device; plan() copies the three CSR arrays.
    rows.h2d_bytes = (rows.gather.numel() * 8 + rows.empty.numel()
                      + 4 * (rows.qo_indptr.numel() + rows.kv_indptr.numel() + rows.kv_len.numel()))
    return rows


def per_row_ids(rows, virtual_ids, dcp_size: int):
    import torch

    gather = rows.gather
    ids = virtual_ids[torch.clamp(gather, min=0)].to(torch.int64) // dcp_size
    return torch.where(gather >= 0, ids, torch.zeros_like(ids)).to(torch.int32)


# ---------------------------------------------------------------- one shape


def batch(bs: int, context: int, draft_tokens: int):
    """``bs`` requests of ``context`` committed tokens and ``draft_tokens`` more, their locs in logical pages of
    ``64 x dcp`` slots (position p at a loc with loc % dcp == p % dcp), as sglang's allocator hands them out."""
    import torch

    page = 64 * DCP
    width = -(-(context + draft_tokens) // page) * page
    base = torch.arange(bs, dtype=torch.int64)[:, None] * width
    req_to_token = (base + torch.arange(width)[None, :] + page).to(torch.int32)
    return req_to_token, torch.arange(bs, dtype=torch.int64)


def measure(bs: int, context: int, algorithm: str, draft_tokens: int, repeats: int) -> dict:
    import torch

    from sglang_dcp_dspark.plugin import dcp_verify

    req_to_token, rpi = batch(bs, context, draft_tokens)
    prefix = torch.full((bs,), context, dtype=torch.int64)
    q_lens = torch.full((bs,), draft_tokens, dtype=torch.int64)
    held = bs * (context + draft_tokens)
    qo = torch.arange(0, (bs + 1) * draft_tokens, draft_tokens, dtype=torch.int32)
    kv = torch.arange(0, (bs + 1) * (context + draft_tokens), context + draft_tokens, dtype=torch.int32)

    def timed(fn, repeats=repeats):
        times, out = [], None
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return out, statistics.median(times)

    # Before: the per-row plan on the host, then its gather on the device over sglang's virtual id stream.
    old, old_host = timed(lambda: per_row_plan(qo, kv, DCP, 0))
    stream = torch.cat([req_to_token[r, : context + draft_tokens] for r in range(bs)])
    _, old_dev = timed(lambda: per_row_ids(old, stream, DCP))
    old_handed = sum(int(per_row_plan(qo, kv, DCP, r).kv_len.sum()) for r in range(DCP))

    # Now: the split plan on the host, its numbers packed for one copy, the ids by sglang's Triton builder.
    def split_host():
        plan = dcp_verify.plan_split(prefix, q_lens, dcp_size=DCP, dcp_rank=0)
        return plan, plan.device_pack()

    # Sub-millisecond: many repeats, so the median is the plan's and not the machine's moment.
    (plan, pack), new_host = timed(split_host, repeats=max(repeats, SPLIT_REPEATS))
    source = SimpleNamespace(ids=req_to_token, row_ids=rpi, row_stride=req_to_token.stride(0))
    meta = dcp_verify.unpack(pack.clone(), plan.bs, plan.tokens)
    prefix_ids = torch.empty(plan.prefix_ids, dtype=torch.int32)
    window_ids = torch.empty(plan.window_ids, dtype=torch.int32)
    _, new_dev = timed(lambda: dcp_verify.build_ids(plan, source, rpi, prefix_ids, window_ids, meta))
    new_handed = sum(dcp_verify.kv_handed(dcp_verify.plan_split(prefix, q_lens, dcp_size=DCP, dcp_rank=r))
                     for r in range(DCP))
    # plan() copies each side's qo_indptr, kv_indptr and kv_len; the pack is the one other copy.
    new_h2d = 4 * (pack.numel() + 2 * (bs + 1) + bs + 2 * (plan.tokens + 1) + plan.tokens)

    tokens = bs * draft_tokens
    stock_graph = bs * context * 4
    old_graph = tokens * (-(-context // DCP) + 1) * 4 + 4 * (3 * tokens + 2) + tokens
    new_graph = 4 * (tokens * dcp_verify.window_capacity(draft_tokens, DCP) + 3 * tokens + 2
                     + dcp_verify.pack_size(bs, tokens))
    return {"algorithm": algorithm, "draft_tokens": draft_tokens, "bs": bs, "context": context, "held": held,
            "per_row": {"kv_ratio": old_handed / held, "host_elements": old.host_elements, "h2d_bytes": old.h2d_bytes,
                        "host_ms": old_host, "device_ms": old_dev, "graph_bytes": old_graph},
            "split": {"kv_ratio": new_handed / held, "host_elements": plan.host_elements + pack.numel(),
                      "h2d_bytes": new_h2d, "host_ms": new_host, "device_ms": new_dev, "graph_bytes": new_graph},
            "stock_decode_graph_bytes": stock_graph}


def size(n: float) -> str:
    return f"{n / MB:,.1f} MB" if n >= 0.1 * MB else f"{n / 1e3:,.1f} kB"


def table(rows: list[dict]) -> list[str]:
    out = [f"one verify step at dcp {DCP}, rank 0: the per-row design (before) over the split one (now)",
           f"{'draft':<9}{'bs':>3}{'context':>8} {'design':<8}{'KV x':>6}{'host elems':>12}{'H2D':>10}"
           f"{'host ms':>9}{'dev ms*':>9}{'graph MB':>10}{'stock MB':>10}"]
    for r in rows:
        shape = f"{r['algorithm'] + ' ' + str(r['draft_tokens']):<9}{r['bs']:>3}{r['context'] // 1024:>7}K"
        for name, key in (("per-row", "per_row"), ("split", "split")):
            d = r[key]
            stock = f"{r['stock_decode_graph_bytes'] / MB:>10.2f}" if key == "per_row" else ""
            out.append(f"{shape if key == 'per_row' else '':<20} {name:<8}{d['kv_ratio']:>5.2f}x{d['host_elements']:>12,}"
                       f"{size(d['h2d_bytes']):>10}{d['host_ms']:>9.2f}{d['device_ms']:>9.1f}"
                       f"{d['graph_bytes'] / MB:>10.2f}{stock}")
    out.append("graph MB: the CUDA-graph buffers a design adds to stock's; stock MB: stock's own decode buffers")
    out.append("(cuda_graph_kv_indices) at the same max_bs and context_len, which the split's prefix reuses")
    out.append("* device work on this machine's CPU (the split's in Triton's interpreter): for information only")
    return out


def claims(rows: list[dict]) -> tuple[list[str], bool]:
    """The split's host time at batch 32 from 4K to 128K, and its H2D bytes across contexts."""
    out, ok = [], True
    for algorithm, _ in DRAFTS:
        at = {r["context"]: r for r in rows if r["algorithm"] == algorithm and r["bs"] == 32}
        if CONTEXTS[0] not in at or CONTEXTS[-1] not in at:
            continue
        growth = at[CONTEXTS[-1]]["split"]["host_ms"] / at[CONTEXTS[0]]["split"]["host_ms"]
        h2d = {r["split"]["h2d_bytes"] for r in rows if r["algorithm"] == algorithm and r["bs"] == 32}
        old = at[CONTEXTS[-1]]["per_row"]["host_ms"] / at[CONTEXTS[0]]["per_row"]["host_ms"]
        good = growth <= GROWTH_BOUND and len(h2d) == 1
        ok &= good
        out.append(f"{algorithm} bs 32: split host planning 128K/4K = {growth:.2f}x (bound {GROWTH_BOUND}x; per-row "
                   f"{old:.1f}x); split H2D bytes across contexts: {', '.join(size(b) for b in sorted(h2d))}"
                   f" -> {'met' if good else 'NOT MET'}")
    return out, ok


def main(argv: list[str]) -> int:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton imports: sglang's index builder on the CPU
    try:
        import sglang.kernels.ops.attention.dcp_kernels  # noqa: F401
    except ImportError as exc:
        print(f"error: sglang's DCP index builder is not importable ({exc}); expected a tree of 0.5.20 or later; "
              "fix: PYTHONPATH=build/trees/sglang-0.5.23 python bench/verify_cost.py", file=sys.stderr)
        return 2
    smoke = "--smoke" in argv
    shapes = [(b, c, a, w) for a, w in DRAFTS for b in BATCHES for c in CONTEXTS]
    if smoke:
        shapes = [(BATCHES[0], CONTEXTS[0], *DRAFTS[0])]
    rows = [measure(b, c, a, w, repeats=1 if smoke else (3 if b * c > 2**21 else 7)) for b, c, a, w in shapes]
    lines, ok = claims(rows)
    if "--json" in argv:
        print(json.dumps({"dcp": DCP, "rows": rows, "claims_met": ok}))
    else:
        print("\n".join(table(rows) + lines))
    return 0 if ok or smoke else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
