"""sglang 0.5.19 and 0.5.20: resolution becomes a separate act; every HiCache pool comes from the assembler.

What changed from 0.5.18, as read in the 0.5.19 wheel:

- ``ServerArgs.__post_init__`` no longer resolves: ``prepare_server_args``
  returns the record as the caller asked for it, resolution is
  ``resolve_once()`` (``arg_groups/pipeline.py``), and it never writes the
  fields back: a resolved value is read with
  ``arg_groups.overrides.resolution_result``. sglang's refusals come from
  ``resolve_once()``. The HiCache + DCP gate moved to
  ``arg_groups/hicache_hook.py::resolve_hicache_dcp_compatibility``.
- ``--hicache-host-memory-mode`` (``cache``, ``buffer_only``: ratio 1.2 by default).
- Every HiCache launch builds a ``UnifiedRadixCache``: the target's host pool
  is the anchor of a ``HostPoolGroup`` from
  ``hybrid_pool_assembler.build_kv_only_stack``, and a SIDECAR draft gets its
  own host pool from ``build_hicache_draft_sidecars`` /
  ``build_full_draft_pools`` at the widened page. Both read only the runtime
  context (``get_memory()``, ``get_parallel()``).
- Free RAM is divided among a host's ranks (``host_memory_budget_bytes``).
"""

from __future__ import annotations

from types import SimpleNamespace

from ...plugin import hooks
from . import Built, Models, Pinned, Release, decode_ratio, device_pools, draft_plan, plan_name
from .sglang_0_5_18 import runtime_rank

# The sidecar's sglang modules, as the hook table names them: the pools are built with their hooks in effect.
ASSEMBLER = hooks.ASSEMBLER
SIDECARS = "hybrid_pool_assembler.build_hicache_draft_sidecars"


class Adapter(Release):
    first = "0.5.19"
    changes = (
        "resolution is ServerArgs.resolve_once(), read through resolution_result; the gate is arg_groups/hicache_hook",
        "every HiCache pool from hybrid_pool_assembler: build_kv_only_stack (HostPoolGroup) and the draft sidecar",
        "free host RAM divided among a host's ranks",
    )

    @classmethod
    def matches(cls) -> bool:
        from sglang.srt.server_args import ServerArgs

        try:
            from sglang.srt.arg_groups.overrides import resolution_result  # noqa: F401
            from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler
        except ImportError:
            return False
        return hasattr(ServerArgs, "resolve_once") and hasattr(hybrid_pool_assembler, "build_hicache_draft_sidecars")

    def resolve(self, argv: list[str], *, hooked: bool = False):
        args = super().resolve(argv, hooked=hooked)
        with self.resolution_hooks(hooked):
            args.resolve_once()
        return args

    def value(self, args, name: str, default=None):
        from sglang.srt.arg_groups.overrides import resolution_result

        if not hasattr(args, name):
            return default
        return resolution_result(args, name)

    # The runtime context a rank's pools are built in; 0.5.21 adds its budget scope.
    def rank(self, launch, device_rows: int, host_ram: int, backup: str | None):
        extra = {"hicache_host_memory_mode": launch.hicache_host_memory_mode}
        if backup is not None:
            extra["hicache_draft_backup"] = backup
        return runtime_rank(launch, device_rows, host_ram, per_rank=True, **extra)

    def sizing_scope(self, launch, params, plan, rank):
        """Where a release sizes the host pools at build time (0.5.21's auto-sizing); nothing here."""
        import contextlib

        return contextlib.nullcontext()

    def build(self, launch, models: Models, device_rows: int, *, hooked: bool, host_ram: int,
              backup: str | None = None) -> Built:
        import importlib

        from sglang.srt.runtime_context import get_memory

        from ...core import sidecar
        from ...core.sizing import HostPoolSize

        assembler = importlib.import_module(ASSEMBLER)
        rank = self.rank(launch, device_rows, host_ram, backup)
        built = Built()
        with sidecar.on_rank(rank), self.hooks_on(ASSEMBLER, hooked), self.hooks_on(hooks.AUTO_SIZE, hooked):
            dev = device_pools(launch, models, device_rows)
            if launch.hicache_ratio is None and launch.disaggregation_mode == "decode":
                decode_ratio(launch, dev.target)
            plan, packed = (None, ()) if dev.draft is None else draft_plan(launch, models, dev.draft)
            built.draft_plan = plan_name(plan)
            sidecars = tuple(plan.device_pools) if built.draft_plan == "SIDECAR" else ()
            params = sidecar.cache_params(SimpleNamespace(rank=rank, draft_device=None), mtp_draft_device_pools=packed,
                                          sidecar_draft_device_pools=sidecars)
            params.token_to_kv_pool_allocator = SimpleNamespace(get_kvcache=lambda: dev.target)
            params.req_to_token_pool = None
            try:
                with self.sizing_scope(launch, params, plan, rank) as sized:
                    built.hicache_ratio = get_memory().hicache_ratio
                    if sized is not None:
                        built.auto_sized_from = sized
                    group, _ = assembler.build_kv_only_stack(
                        params=params, kv_pool=dev.target, full_layer_mapping={i: i for i in range(dev.target.layer_num)},
                        load_cache_event=None, storage_backend=None, use_mla=True,
                    )
                    target = group.anchor_entry.host_pool
                    built.pools.append(Pinned("target KV" + (" + packed draft layers" if packed else ""), "target",
                                              "hybrid_pool_assembler.build_kv_only_stack", HostPoolSize.of(target)))
                    built.pools += self.extra_pools(launch, dev, group)
                    if built.draft_plan == "PACKED":
                        built.draft_path = "packed into the target host pool (mtp_draft_device_pools)"
                    elif sidecars:
                        built.draft_path = f"{SIDECARS} -> build_full_draft_pools"
                        tree_cache = SimpleNamespace(cache_controller=SimpleNamespace(
                            mem_pool_host=group, page_size=launch.logical_page_size,
                            transfer_layer_id_max=dev.target.layer_num))
                        _, entries = assembler.build_hicache_draft_sidecars(draft_device_pools=sidecars, tree_cache=tree_cache)
                        for entry in entries:
                            name = str(getattr(entry.name, "value", entry.name)).lower()
                            role = "draft" if not any(p.role == "draft" for p in built.pools) else "extra"
                            built.pools.append(Pinned(f"draft sidecar ({name})" if role == "extra" else "draft sidecar",
                                                      role, "hybrid_pool_assembler.build_full_draft_pools",
                                                      HostPoolSize.of(entry.host_pool)))
            except (ValueError, NotImplementedError) as exc:  # sglang's own start-up refusals while building
                built.startup_error = " ".join(str(exc).split())
        return built

    def extra_pools(self, launch, dev, group) -> list[Pinned]:
        """Host pools beside the KV anchor: a DSA model's indexer (``pool_host/dsa.py`` from 0.5.19)."""
        if not hasattr(dev.target, "index_head_dim"):
            return []
        from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as assembler
        from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost
        from sglang.srt.runtime_context import get_memory

        from ...core.sizing import HostPoolSize

        pool = DSAIndexerPoolHost(dev.target, group.anchor_entry.host_pool, get_memory().hicache_mem_layout,
                                  allocator_type=assembler._get_allocator_type())
        return [Pinned("DSA indexer", "extra", "pool_host.dsa.DSAIndexerPoolHost", HostPoolSize.of(pool))]
