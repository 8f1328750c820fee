"""sglang 0.5.21 and later: HiCache sizes itself from the host's memory.

What changed from 0.5.20, as read in the wheels of 0.5.21 and later:

- ``--hicache-host-memory-fraction`` (default 0.8): without an explicit
  ``--hicache-ratio`` or ``--hicache-size``, the resolved ratio (2.0) is only a
  ceiling, and ``hicache_auto_size.auto_size_hicache`` lowers it while the
  tree cache is built, from an estimate of the host bytes each unit of ratio
  costs (``_estimate_hicache_bytes``), so that the pools fit the fraction of
  this rank's share of free RAM.
- One host-memory budget books every pool (``host_memory_budget_scope``);
  ``pool_host/base.py`` no longer reads psutil itself.
- 0.5.22: a DSA model is refused under DCP + HiCache at argument time
  (``arg_groups/model_overrides/deepseek_v2.py``), and its indexer host pool
  is built from the device pool's declarations (``host_pool_decls``).
- 0.5.23: the draft sidecar gets exactly ``logical_size`` rows
  (``host_token_capacity``), the FUSED draft plan, and ``CacheInitParams``
  carries ``sidecar_draft_device_pools`` into the stack.
"""

from __future__ import annotations

import contextlib

from . import Pinned
from .sglang_0_5_19 import Adapter as Previous


class Adapter(Previous):
    first = "0.5.21"
    changes = (
        "auto-sizing from --hicache-host-memory-fraction lowers the ratio while the pools are built",
        "one host-memory budget books every pool (host_memory_budget_scope)",
        "0.5.22: DSA refused under DCP + HiCache; the DSA indexer host pool from declarations",
        "0.5.23: the draft sidecar at exactly logical_size rows; FUSED plan; sidecar_draft_device_pools in CacheInitParams",
    )

    @classmethod
    def matches(cls) -> bool:
        if not Previous.matches():
            return False
        from sglang.srt.mem_cache.pool_host import base

        return hasattr(base, "host_memory_budget_scope")

    @contextlib.contextmanager
    def sizing_scope(self, launch, params, plan, rank):
        """sglang's auto-sizing around the build, inside this rank's budget; yields the ratio it started from."""
        from sglang.srt.mem_cache import hicache_auto_size
        from sglang.srt.runtime_context import get_memory

        requested = get_memory().hicache_ratio
        fraction = get_memory().hicache_host_memory_fraction
        with hicache_auto_size.auto_size_hicache(params, plan, enabled=True):
            yield requested if fraction is not None else None

    def rank(self, launch, device_rows: int, host_ram: int, backup):
        from dataclasses import replace

        rank = super().rank(launch, device_rows, host_ram, backup)
        # Stated even when None (an explicit ratio or size turned auto-sizing off): the
        # published stand-in configuration would otherwise carry the default fraction.
        return replace(rank, extra={**rank.extra, "hicache_host_memory_fraction": launch.hicache_host_memory_fraction})

    def extra_pools(self, launch, dev, group) -> list[Pinned]:
        if not hasattr(dev.target, "host_pool_decls"):
            return super().extra_pools(launch, dev, group)
        # 0.5.22 on: the indexer is declared by the device pool and built by the assembler's own builder.
        if not hasattr(dev.target, "index_head_dim"):
            return []
        from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as assembler
        from sglang.srt.mem_cache.hybrid_cache.host_pool_config import prepare_host_pool_config

        from ...core.sizing import HostPoolSize

        layers = dev.target.layer_num
        config = prepare_host_pool_config(
            decls=dev.target.host_pool_decls(), full_layer_mapping={i: i for i in range(layers)},
            transfer_layer_id_max=layers, transfer_page_size=launch.logical_page_size, packed_draft_device_pools=(),
        )
        declared = assembler.build_host_pool_group(config=config)
        return [Pinned("DSA indexer", "extra", "hybrid_pool_assembler.build_host_pool_group: DSAIndexerPoolHost",
                       HostPoolSize.of(entry.host_pool))
                for name, entry in declared.entry_map.items() if "INDEXER" in str(name).upper()]
