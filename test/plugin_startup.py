"""Child process for test_plugin_startup: a scheduler's start-up order, on whichever sglang PYTHONPATH selects.

As ``run_scheduler_process`` does it: the scheduler module is imported (it
imports server_args and kv_cache_builder), then ``load_plugins()``, then the
scheduler module's own ``configure_logger`` binding (what
``configure_scheduler_process`` calls), then the hooked calls. Only the GPU
parts are stand-ins: the pools are built on CPU by ``hostpool``, and
``configure_logger`` gets a namespace with the one field it reads.

Options (each a stand-in for a fault, applied before load_plugins()):
  --log-level LEVEL      sglang's --log-level
  --configure-first      configure logging, then load_plugins(), then import the
                         scheduler: the probes run with logging live
  --probe-failure        the registration probe's pool builder raises
  --new-pool-arg         MLATokenToKVPool requires an argument 0.5.17 does not pass
  --hooked-call          register a dcp-8 draft through sglang's (hooked) registration
  --sidecar-call         0.5.19 on: build a dcp-8 target and draft sidecar at --hicache-size 100 through
                         sglang's (hooked) hybrid_pool_assembler, as a scheduler's tree cache does
  --cuda-trap            torch.cuda entry points raise (and are counted) from load_plugins() on
Prints one JSON line on stdout; sglang's log goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from types import SimpleNamespace

CUDA_ENTRY_POINTS = (
    "is_available", "current_device", "device_count", "set_device", "synchronize", "Stream", "Event",
    "current_stream", "stream", "get_device_properties", "get_device_capability", "mem_get_info",
    "empty_cache", "init", "is_initialized", "cudart", "memory_allocated",
)


def cuda_trap() -> list[str]:
    """Make every torch.cuda entry point raise, and count the calls (a probe may swallow the error)."""
    import torch

    touched: list[str] = []

    def trap(name):
        def raiser(*args, **kwargs):
            touched.append(name)
            raise RuntimeError(f"torch.cuda.{name} called")

        return raiser

    for name in CUDA_ENTRY_POINTS:
        if hasattr(torch.cuda, name):
            setattr(torch.cuda, name, trap(name))

    class NoSglKernel:
        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] == "sgl_kernel":
                touched.append(f"import {fullname}")
                raise ImportError(f"{fullname} imported")
            return None

    sys.meta_path.insert(0, NoSglKernel())
    return touched


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-level", default="info")
    for flag in ("configure-first", "probe-failure", "new-pool-arg", "hooked-call", "sidecar-call", "cuda-trap"):
        parser.add_argument(f"--{flag}", action="store_true")
    args = parser.parse_args()
    server_args = SimpleNamespace(log_level=args.log_level)  # all configure_logger reads

    from sglang.srt.plugins import load_plugins

    if args.configure_first:
        from sglang.srt.utils.common import configure_logger

        configure_logger(server_args, prefix=" TP0")
    else:
        from sglang.srt.managers import scheduler

    # The plugin's probes build their pools here; the injected failure goes where they look.
    from sglang_dcp_dspark.core import probes as hostpool

    if args.probe_failure:
        real_build = hostpool.build_pools

        def build_pools(g, register=None):
            if g.device_rows == 64:  # the probe's geometry, not the launch's
                raise RuntimeError("injected probe failure")
            return real_build(g, register)

        hostpool.build_pools = build_pools
    if args.new_pool_arg:
        from sglang.srt.mem_cache import memory_pool

        real_init = memory_pool.MLATokenToKVPool.__init__

        def init(self, *a, layout_hint_from_a_later_release, **k):
            real_init(self, *a, **k)

        memory_pool.MLATokenToKVPool.__init__ = init
    touched = cuda_trap() if args.cuda_trap else []

    load_plugins()
    if args.configure_first:
        from sglang.srt.managers import scheduler  # probes run now, logging live
    else:
        scheduler.configure_logger(server_args, prefix=" TP0")
    touched_by_probes = list(touched)
    if args.cuda_trap:  # control: the trap does catch a call
        import torch

        with contextlib.suppress(RuntimeError):
            torch.cuda.current_device()
        assert touched[len(touched_by_probes):] == ["current_device"], touched

    result: dict = {"touched": touched_by_probes}
    if args.hooked_call:
        if args.new_pool_arg:  # the launch's own pools come from the new release's code: undo the stand-in
            memory_pool.MLATokenToKVPool.__init__ = real_init
        try:
            pair = hostpool.build_pools(hostpool.Geometry(8))
            result["call"] = f"draft rows {pair.draft_host_pool.size} for {pair.target_host_pool.logical_size} logical slots"
        except Exception as exc:
            result["call"] = f"{type(exc).__name__}: {exc}"
    if args.sidecar_call:
        from sglang_dcp_dspark.core import sidecar

        pools = sidecar.built(sidecar.Rank(8, device_rows=500_000, target_layers=61, hicache_size=100))
        result["sidecar"] = {"target_rows": pools.target_host.size, "draft_rows": pools.draft_host.size}
    from sglang_dcp_dspark import plugin

    result["findings"] = {k: v.verdict.name for k, v in plugin.findings.items()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
