"""sglang 0.5.17: the release this project was built around.

What a launch does here, as read in the 0.5.17 wheel:

- ``prepare_server_args`` resolves every field in ``ServerArgs.__post_init__``
  (``hicache_ratio`` is a plain 2.0 by default), so the record's fields are the
  resolved values. The HiCache + DCP gate is the method
  ``ServerArgs._resolve_hicache_dcp_compatibility``; it refuses every
  speculative algorithm (the defect this project's resolver hook fixes).
- ``HiRadixCache`` builds the target's ``MLATokenToKVPoolHost`` from
  ``server_args`` at the widened page (page x dcp), striped over the DCP ranks.
- ``Scheduler.__init__`` registers the draft through
  ``kv_cache_builder.maybe_register_hicache_draft`` with the server's page,
  sized from the target's *physical* rows: 1/dcp of the logical slots it is
  indexed by (the defect the registration hook fixes).
- A DSA model (``index_topk``) also gets ``memory_pool_host.DSAIndexerPoolHost``
  beside the KV pool, one page more rows than it, 132 B per token per layer
  at index_head_dim 128.
- With the plugin, ``Scheduler.init_memory_pools`` counts the draft in
  ``--hicache-size`` and stops a launch whose pools cannot fit free RAM.
"""

from __future__ import annotations

import inspect

from . import Built, Models, Pinned, Release, device_pools, host_pools_on_meta, memory_pool_host_indexer

REGISTRATION = "kv_cache_builder.maybe_register_hicache_draft"


class Adapter(Release):
    first = "0.5.17"
    changes = (
        "fields resolved in ServerArgs.__post_init__; the gate refuses every speculative algorithm under DCP + HiCache",
        "target host pool from HiRadixCache; draft host pool from maybe_register_hicache_draft at the target's physical rows",
    )

    @classmethod
    def matches(cls) -> bool:
        from sglang.srt.mem_cache import kv_cache_builder

        register = getattr(kv_cache_builder, "maybe_register_hicache_draft", None)
        return register is not None and "draft_worker" in inspect.signature(register).parameters

    def build(self, launch, models: Models, device_rows: int, *, hooked: bool, host_ram: int,
              backup: str | None = None) -> Built:
        from ...core import probes
        from ...core.errors import StartupError
        from ...core.sizing import HostPoolSize
        from ...plugin import hooks

        built = Built(hicache_ratio=launch.hicache_ratio, draft_plan="registration" if models.draft else None,
                      draft_path=REGISTRATION if models.draft else None)
        hicache_size = launch.hicache_size
        # 0.5.17 checks each host pool against the node's whole free RAM (psutil), not a rank's share.
        with host_pools_on_meta(host_ram):
            dev = device_pools(launch, models, device_rows)
            if hooked and dev.draft is not None:
                # The plugin's scheduler hook, on stand-ins for the scheduler's pools:
                # it shares --hicache-size with the draft, or stops the launch.
                try:
                    hicache_size = self._budget(launch, dev, host_ram)
                except StartupError as exc:
                    built.startup_error = str(exc)
                if hicache_size != launch.hicache_size:
                    built.target_hicache_size = hicache_size
            g = probes.Geometry(launch.dcp_size, launch.hicache_mem_layout, device_rows=device_rows,
                                 page_size=launch.page_size, host_ratio=launch.hicache_ratio, hicache_size_gb=hicache_size)
            try:
                target = probes.build_target_host_pool(g, device_pool=dev.target)
            except ValueError as exc:  # sglang's own host-memory check refuses the target pool
                built.startup_error = built.startup_error or " ".join(str(exc).split())
                return built
            built.pools.append(Pinned("target KV", "target", "HiRadixCache: MLATokenToKVPoolHost", HostPoolSize.of(target)))
            if models.dsa_index_head_dim:
                built.pools.append(memory_pool_host_indexer(launch, dev.target, target))
            if dev.draft is not None:
                from sglang.srt.mem_cache import kv_cache_builder

                register = kv_cache_builder.maybe_register_hicache_draft
                if hooked:
                    # As the plugin would leave it; a short draft is reported by
                    # preflight as a stop at startup rather than raised here.
                    hooked_target = f"sglang.srt.mem_cache.{REGISTRATION}"
                    self.findings[hooked_target], register = hooks.BY_TARGET[hooked_target].wrap(register, check_only=False)
                kwargs = probes.draft_registration_args(target, g, draft_device_pool=dev.draft)
                kwargs["page_size"] = launch.page_size  # the scheduler passes its own page, not the widened one
                kwargs["server_args"].hicache_ratio = launch.hicache_ratio
                try:
                    register(**kwargs)
                except (StartupError, ValueError) as exc:  # the guard, sglang's own host-memory check
                    built.startup_error = built.startup_error or " ".join(str(exc).split())
                draft = kwargs["tree_cache"].cache_controller.mem_pool_host_draft
                if draft is not None:
                    built.pools.append(Pinned("draft", "draft", REGISTRATION, HostPoolSize.of(draft)))
        return built

    def _budget(self, launch, dev, host_ram: int) -> float:
        """The plugin's budget (``budget.fit_hicache_size``) on a scheduler stand-in; returns the target's --hicache-size."""
        from types import SimpleNamespace

        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        from ...core import budget, probes
        from ...plugin.hooks import BY_TARGET, Verdict, shipped_budget_verdict

        target = "sglang.srt.managers.scheduler.Scheduler.init_memory_pools"
        # The verdict on 0.5.17's scheduler as its wheel ships it needs no import of it; any other is judged.
        self.findings[target] = shipped_budget_verdict() or BY_TARGET[target].judged()
        if self.findings[target].verdict is not Verdict.NEEDS_FIX:
            return launch.hicache_size
        server_args = SimpleNamespace(
            enable_hierarchical_cache=True, hicache_size=launch.hicache_size, hicache_ratio=launch.hicache_ratio,
            dcp_size=launch.dcp_size, tp_size=launch.tp_size, pp_size=launch.pp_size, nnodes=launch.nnodes,
            enable_multi_layer_eagle=False, speculative_algorithm="DSPARK",
        )
        scheduler = SimpleNamespace(
            server_args=server_args, spec_algorithm=SpeculativeAlgorithm.DSPARK, draft_worker=probes.draft_worker(dev.draft),
            tp_worker=SimpleNamespace(model_runner=SimpleNamespace(token_to_kv_pool=dev.target)),
        )
        # fit_hicache_size takes the node's available RAM and divides it among the node's ranks itself.
        budget.fit_hicache_size(scheduler, available_bytes=host_ram)
        return server_args.hicache_size
