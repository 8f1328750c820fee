"""sglang 0.5.18: PR #35221 ships; pools read a published runtime context.

What changed from 0.5.17, as read in the 0.5.18 wheel:

- The HiCache + DCP gate admits DSPARK, and the draft host pool spans the
  target's ``logical_size`` (PR #35221).
- ``hicache_ratio`` defaults to ``None``: ``__post_init__`` makes it 2.0,
  except on a decode server, which resolves it once its KV pool is built
  (``kv_cache_builder.resolve_decode_retraction_backup``: 2.0 for an MLA
  pool, whose retraction backup is ``cpu_tensor``).
- ``HiRadixCache`` reads ``get_memory().hicache_ratio`` and the DCP rank from
  ``get_parallel()``, so its pools need a published runtime context.
- The draft plan appears (``BaseSpecWorker._build_hicache_draft_plan``):
  PACKED puts NextN draft layers into the target's host pool; SIDECAR gives
  the draft its own host pool, on a plain-MLA target through
  ``kv_cache_builder._register_legacy_hicache_draft`` at the server's page.
"""

from __future__ import annotations

from . import (
    Built,
    Models,
    Pinned,
    Release,
    decode_ratio,
    device_pools,
    draft_plan,
    memory_pool_host_indexer,
    plan_name,
)

LEGACY = "kv_cache_builder._register_legacy_hicache_draft"


def runtime_rank(launch, device_rows: int, host_ram: int, *, per_rank: bool, **extra):
    """The :class:`sidecar.Rank` for this launch: its resolved HiCache fields published, host buffers on meta.

    ``per_rank``: sglang divides free RAM among a host's ranks (0.5.19 on);
    before, each pool is checked against the whole node's free RAM.
    """
    from ...core import rules, sidecar
    from ...core.meta import on_meta

    ranks = rules.ranks_per_node(launch.tp_size, launch.pp_size, launch.nnodes)
    reserve = _reserve()
    available = max(0, host_ram - reserve) // ranks if per_rank else max(0, host_ram - reserve)
    fields = {"enable_hierarchical_cache": launch.enable_hierarchical_cache,
              "speculative_algorithm": launch.speculative_algorithm,
              "page_size": launch.page_size, "hicache_io_backend": launch.hicache_io_backend,
              "hicache_storage_backend": launch.hicache_storage_backend,
              "disaggregation_mode": launch.disaggregation_mode or "null", **extra}
    keep = {k: v for k, v in fields.items() if v is not None or k == "hicache_host_memory_fraction"}
    return sidecar.Rank(
        dcp_size=launch.dcp_size, device_rows=device_rows, page_size=launch.page_size, hicache_size=launch.hicache_size,
        hicache_ratio=launch.hicache_ratio, layout=launch.hicache_mem_layout, host_memory=available,
        tp_size=launch.tp_size, extra=keep, meta_bookkeeping=on_meta(), meta_buffers=on_meta(),
    )


def _reserve() -> int:
    from sglang.srt.mem_cache.pool_host.base import HICACHE_HOST_MEMORY_RESERVE_BYTES

    return HICACHE_HOST_MEMORY_RESERVE_BYTES


class Adapter(Release):
    first = "0.5.18"
    changes = (
        "PR #35221: DSPARK admitted under DCP + HiCache; the draft host pool spans the target's logical_size",
        "hicache_ratio is None until resolved (a decode server resolves it against its retraction backup)",
        "pools read a published runtime context; draft plans (PACKED, SIDECAR); the legacy sidecar registration",
    )

    @classmethod
    def matches(cls) -> bool:
        from sglang.srt.mem_cache import kv_cache_builder

        return hasattr(kv_cache_builder, "_register_legacy_hicache_draft")

    def build(self, launch, models: Models, device_rows: int, *, hooked: bool, host_ram: int,
              backup: str | None = None) -> Built:
        from sglang.srt.runtime_context import get_memory

        from ...core import probes, sidecar
        from ...core.sizing import HostPoolSize

        rank = runtime_rank(launch, device_rows, host_ram, per_rank=False)
        built = Built()
        with sidecar.on_rank(rank):
            dev = device_pools(launch, models, device_rows)
            if launch.hicache_ratio is None:
                decode_ratio(launch, dev.target)
            built.hicache_ratio = get_memory().hicache_ratio
            plan, packed = (None, ()) if dev.draft is None else draft_plan(launch, models, dev.draft)
            built.draft_plan = plan_name(plan)
            g = probes.Geometry(launch.dcp_size, launch.hicache_mem_layout, device_rows=device_rows,
                                 page_size=launch.page_size, host_ratio=built.hicache_ratio,
                                 hicache_size_gb=launch.hicache_size)
            target = _target(g, dev.target, packed)
            built.pools.append(Pinned("target KV" + (" + packed draft layers" if packed else ""), "target",
                                      "HiRadixCache: MLATokenToKVPoolHost", HostPoolSize.of(target)))
            if models.dsa_index_head_dim:
                built.pools.append(memory_pool_host_indexer(launch, dev.target, target))
            if built.draft_plan == "SIDECAR":
                from sglang.srt.mem_cache import kv_cache_builder

                controller = probes.ControllerStandIn(target)
                from types import SimpleNamespace

                kv_cache_builder._register_legacy_hicache_draft(
                    tree_cache=SimpleNamespace(cache_controller=controller), draft_pool=dev.draft,
                    server_args=SimpleNamespace(hicache_mem_layout=launch.hicache_mem_layout,
                                                hicache_storage_backend=launch.hicache_storage_backend),
                    page_size=launch.page_size,  # the scheduler's page, not the widened one
                )
                built.draft_path = LEGACY
                if controller.mem_pool_host_draft is not None:
                    built.pools.append(Pinned("draft sidecar", "draft", LEGACY, HostPoolSize.of(controller.mem_pool_host_draft)))
            elif built.draft_plan == "PACKED":
                built.draft_path = "packed into the target host pool (mtp_draft_device_pools)"
        return built


def _target(g, device_pool, packed):
    """The target host pool as HiRadixCache builds it (with packed NextN draft layers when the plan packs them)."""
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    extra = {"mtp_draft_device_pools": packed} if packed else {}
    return MLATokenToKVPoolHost(
        device_pool, g.host_ratio, g.hicache_size_gb, g.logical_page_size, g.layout,
        dcp_size=parallel.attn_dcp_size, dcp_rank=parallel.attn_dcp_rank, **extra,
    )
