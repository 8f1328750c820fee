"""`make gpu-check`: the round trip and the eviction stress at dcp 8 (simulated rank) on one CUDA GPU.

Device pools live on cuda, host pools in real pinned memory (cudaHostRegister),
and HiCacheController uses real CUDA streams and events. The transfer ops are
sgl_kernel's when ``sgl_kernel.kvcacheio`` imports, else the reference ops on
CUDA tensors (which still raise on an out-of-bounds row). sglang's JIT HiCache
kernels are switched off unless --jit is given, so the copies go through the
ops named above. One line per case; exit status 1 when any case fails.

Run from the repository root (or a copy of tools/ carried to the GPU machine):
    PYTHONPATH=tools:<dir with sglang> python -m emulation.datapath.gpu_check [--dcp 8] [--jit]
docs/hicache-datapath.md says how to bring sglang's wheel to a machine without network.
"""

from __future__ import annotations

import argparse
import sys
import time

# The sglang modules the harness drives; imported up front, with CUDA hidden (below).
DATA_PATH_MODULES = (
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.pool_host.mla",
    "sglang.srt.mem_cache.pool_host.mha",
    "sglang.srt.mem_cache.allocator.paged",
    "sglang.srt.managers.cache_controller",
    "sglang.srt.mem_cache.hiradix_cache",
    "sglang.srt.mem_cache.kv_cache_builder",
    "sglang.srt.speculative.spec_info",
)


def _import_sglang(ops):
    """Import the data path; sgl_kernel's transfer ops if they import, else the reference ops on CUDA tensors.

    When torch sees CUDA, sglang's modules import CUDA-only kernels at import
    time (sgl_kernel, deep_gemm) for every feature, not just HiCache. A GPU
    machine without sglang's kernel wheel cannot import them, so the modules
    are imported while torch.cuda.is_available() answers False, as on CPU.
    sglang caches that answer (utils.is_cuda), so its own CUDA-only branches
    stay off; the device pools, the pinned host memory, the streams and the
    events are CUDA all the same, because the harness places and substitutes
    them itself (substitutions.substituted(cuda=True)).
    """
    import importlib
    from unittest import mock

    from emulation.datapath.substitutions import sgl_kernel_ops

    real = sgl_kernel_ops()
    if real is not None:
        for name in DATA_PATH_MODULES:
            importlib.import_module(name)
        return real, "sgl_kernel"
    with mock.patch("torch.cuda.is_available", return_value=False):
        for name in DATA_PATH_MODULES:
            importlib.import_module(name)
    return None, "reference ops on cuda"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dcp", type=int, default=8)
    parser.add_argument("--jit", action="store_true", help="let sglang use its JIT HiCache kernels where it can")
    parser.add_argument("--requests", type=int, default=64)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu-check: torch sees no CUDA device; expected one GPU; fix: run on the GPU machine")
        return 2
    from emulation.datapath.substitutions import ReferenceOps

    ops = ReferenceOps()
    kernel_ops, ops_name = _import_sglang(ops)
    from sglang.srt.mem_cache.pool_host import mha, mla

    from emulation.datapath import harness, scenarios

    if not args.jit:
        for module in (mla, mha):
            for name in ("can_use_hicache_jit_kernel", "can_use_write_back_jit_kernel"):
                if hasattr(module, name):
                    setattr(module, name, lambda **_: False)

    print(f"gpu-check: sglang {harness.sglang_version()}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}, ops: {ops_name}{', jit allowed' if args.jit else ''}")
    failures = 0
    dcp = args.dcp
    for draft in harness.DRAFT_KINDS:
        for layout, io in harness.LAYOUT_IO_PAIRS:
            for rank in sorted({0, dcp - 1}):
                case = harness.Case(dcp_size=dcp, dcp_rank=rank, layout=layout, io_backend=io, draft=draft,
                                    device="cuda", page_size=16, device_pages=16)
                for name, run in (("round trip", scenarios.round_trip), ("stress", scenarios.eviction_stress)):
                    kwargs = {"requests": args.requests} if name == "stress" else {}
                    start = time.perf_counter()
                    try:
                        counts = run(case, ops=ReferenceOps(), cuda=True, kernel_ops=kernel_ops, **kwargs)
                        verdict = (f"ok: {counts.tokens_checked} tokens checked, {counts.load_backs} load-backs, "
                                   f"{counts.host_evictions} host slots evicted")
                    except Exception as exc:  # one line per case, then the next case
                        failures += 1
                        verdict = f"FAIL: {type(exc).__name__}: {str(exc)[:300]}"
                    print(f"{case.label():<48} {name:<10} {time.perf_counter() - start:6.2f}s  {verdict}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
