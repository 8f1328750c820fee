"""One DCP group on CPU: ``dcp`` real processes, each a rank with its own real HiCache, joined by gloo.

Each rank process initialises ``torch.distributed`` with the gloo backend and
world size ``dcp``, builds sglang's own ``GroupCoordinator`` for the DCP group
over it (gloo stands in for NCCL; the all-gathers are real collectives, not
mocks) and hands it to sglang through ``get_parallel().override(dcp_group=...)``,
where the sharded draft host pool finds it. It then runs the same
deterministic trace as every other rank through :class:`harness.HiCacheRun`
(sidecar path, 0.5.23's ``UnifiedRadixCache``): the round trip, then the
eviction stress with host-pool wrap-around. ``HiCacheRun.check_device`` checks
the rank's target stripe and its **whole** replicated draft byte for byte
after every load.

The ranks are forked from a forkserver that imported sglang once, so a group
costs one sglang import per test session, not one per rank.

    python -m datapath.ranks --dcp 4 [--draft-backup sharded|replicated] [--drop-stripe-of RANK]
                                     [--layout L --io-backend B] [--draft mla|mha]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import traceback
from dataclasses import asdict, dataclass, field, replace

from .harness import DRAFT, DRAFT_KINDS, LAYOUT_IO_PAIRS, Case, HiCacheRun
from .substitutions import ReferenceOps

# What the forkserver imports before forking any rank: the heavy part of a rank's start.
PRELOAD = (
    "datapath.harness",
    "sglang.srt.mem_cache.registry",
    "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler",
    "sglang.srt.distributed.parallel_state",
)
SCENARIOS = ("round_trip", "stress")
TIMEOUT_S = 180  # a whole group; a rank stuck in a collective is killed past it


@dataclass
class RankResult:
    rank: int
    ok: bool = False
    error: str | None = None
    counts: dict = field(default_factory=dict)  # scenario -> harness.Counts as a dict
    draft_host_rows: int = 0
    target_host_rows: int = 0
    draft_host_bytes: int = 0  # what the draft host pool allocated (the largest over the scenarios' runs)
    draft_h2d_bytes: int = 0  # draft bytes moved host<->device, both directions, over the whole trace
    allgather_bytes: int = 0  # bytes this rank received from the other ranks' stripes
    allgathers: int = 0
    traceback: str | None = None  # of the error, for the command line's report


def _dcp_group(rank: int, dcp: int):
    """sglang's own GroupCoordinator for the DCP group, over the gloo world."""
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    return GroupCoordinator(
        group_ranks=[list(range(dcp))], local_rank=rank, torch_distributed_backend="gloo",
        use_pynccl=False, use_mscclpp=False, use_custom_allreduce=False,
        use_torch_symm_mem_all_reduce=False, use_hpu_communicator=False, use_xpu_communicator=False,
        group_name="dcp",
    )


def _observe(result: RankResult, group, drop_stripe: bool):
    """An on_built callback: count the all-gathers' bytes, and on the sabotaged rank drop its stripe."""
    all_gather = group.all_gather

    def counted(input_, dim=-1, output_tensor_list=None):
        out = all_gather(input_, dim, output_tensor_list)
        result.allgathers += 1
        result.allgather_bytes += out.numel() * out.element_size() - input_.numel() * input_.element_size()
        return out

    def on_built(run: HiCacheRun) -> None:
        group.all_gather = counted
        result.draft_host_rows, result.target_host_rows = run.draft_host.size, run.target_host.size
        result.draft_host_bytes = max(result.draft_host_bytes, run.draft_host_bytes)
        if drop_stripe:
            # This rank never backs up its stripe: its host rows stay as allocated.
            run.draft_host.backup_from_device_all_layer_physical = lambda *args, **kwargs: None

    return on_built


def rank_main(rank: int, dcp: int, store_path: str, case: Case, drop_stripe_of: int | None, out) -> None:
    """One rank's whole life: join the group, run the trace, send back a RankResult."""
    import torch
    import torch.distributed as dist

    from . import scenarios

    torch.set_num_threads(1)
    result = RankResult(rank=rank)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=dcp)
        group = _dcp_group(rank, dcp)
        case = replace(case, dcp_size=dcp, dcp_rank=rank, draft_path="sidecar")
        ops = ReferenceOps()
        kwargs = dict(ops=ops, dcp_group=group, on_built=_observe(result, group, rank == drop_stripe_of))
        result.counts["round_trip"] = asdict(scenarios.round_trip(case, **kwargs))
        result.counts["stress"] = asdict(scenarios.eviction_stress(case, **kwargs))
        result.draft_h2d_bytes = (ops.bytes_between(f"{DRAFT}/host", f"{DRAFT}/device")
                                  + ops.bytes_between(f"{DRAFT}/device", f"{DRAFT}/host"))
        result.ok = True
    except BaseException as exc:  # reported to the parent, which decides what it means
        result.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        result.traceback = traceback.format_exc()
    out.put(asdict(result))


_CONTEXT: multiprocessing.context.BaseContext | None = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(list(PRELOAD))
    return _CONTEXT


def run_group(dcp: int, *, draft_backup: str = "sharded", drop_stripe_of: int | None = None,
              case: Case | None = None, timeout: float = TIMEOUT_S) -> list[dict]:
    """Run one DCP group of ``dcp`` rank processes; their RankResults as dicts, by rank.

    A rank that has not reported within ``timeout`` is killed and reported
    as such: a rank stuck in a collective its peers left must not hang the
    caller.
    """
    ctx = _context()
    case = replace(case or Case(layout="layer_first", io_backend="direct"), draft_backup=draft_backup)
    with tempfile.TemporaryDirectory(prefix="datapath-ranks-") as tmp:
        store = os.path.join(tmp, "store")
        queue = ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(r, dcp, store, case, drop_stripe_of, queue), daemon=True)
                 for r in range(dcp)]
        for p in procs:
            p.start()
        results: dict[int, dict] = {}
        try:
            for _ in procs:
                got = queue.get(timeout=timeout)
                results[got["rank"]] = got
        except Exception:  # queue.Empty: some rank never reported
            pass
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join()
        for r in range(dcp):
            results.setdefault(r, asdict(RankResult(rank=r, error=f"rank {r} did not report within {timeout:.0f} s")))
    return [results[r] for r in range(dcp)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dcp", type=int, default=2)
    parser.add_argument("--draft-backup", choices=("replicated", "sharded"), default="sharded")
    parser.add_argument("--drop-stripe-of", type=int, default=None)
    parser.add_argument("--layout", choices=sorted({layout for layout, _ in LAYOUT_IO_PAIRS}), default="layer_first")
    parser.add_argument("--io-backend", choices=sorted({io for _, io in LAYOUT_IO_PAIRS}), default="direct")
    parser.add_argument("--draft", choices=DRAFT_KINDS, default="mla")
    args = parser.parse_args(argv)
    if (args.layout, args.io_backend) not in LAYOUT_IO_PAIRS:
        parser.error(f"sglang does not keep {args.layout}/{args.io_backend}; pairs: {LAYOUT_IO_PAIRS}")
    case = Case(layout=args.layout, io_backend=args.io_backend, draft=args.draft)
    results = run_group(args.dcp, draft_backup=args.draft_backup, drop_stripe_of=args.drop_stripe_of, case=case)
    for r in results:
        if r["traceback"]:
            print(r["traceback"], file=sys.stderr)
    print(json.dumps([{k: v for k, v in r.items() if k != "traceback"} for r in results], indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
