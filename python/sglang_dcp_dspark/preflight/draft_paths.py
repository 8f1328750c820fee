"""The two draft HiCache host-pool paths of PR #35221's form, run on real CPU host pools.

From the refactor that preceded sgl-project/sglang PR #35221 until 0.5.18,
sglang builds the DSPARK draft host pool in one of two places:

- ``sidecar``: ``hybrid_pool_assembler.build_full_draft_pools``, for a tree
  cache whose controller holds a ``HostPoolGroup``;
- ``legacy``: ``kv_cache_builder._register_legacy_hicache_draft``, for the
  plain HiRadixCache controller holding one host pool.

Both are called here as sglang defines them in the imported tree (the PR's
parent, the parent with the series, or a stock 0.5.18), around a real
dcp-striped ``MLATokenToKVPoolHost``. The draft host pool they return is
sglang's own object, so what is measured is sglang's sizing, not a model of it.
sglang 0.5.17 has neither function; ``probes.build_pools`` registers its draft.
"""

from __future__ import annotations

from types import SimpleNamespace

from ..core import probes
from ..core.errors import DcpDsparkError

DRAFT_PATHS = ("sidecar", "legacy")


def _server_args(g: probes.Geometry) -> SimpleNamespace:
    # The fields the two paths read; no storage backend, since L3 stays refused under DCP.
    return SimpleNamespace(
        hicache_mem_layout=g.layout,
        hicache_storage_backend=None,
        hicache_storage_backend_extra_config=None,
        dcp_size=g.dcp_size,
    )


def _require(module: str, name: str):
    import importlib

    found = getattr(importlib.import_module(module), name, None)
    if found is None:
        import sglang

        raise DcpDsparkError(
            f"{module}.{name} is missing from sglang {getattr(sglang, '__version__', '?')}; expected "
            "sglang 0.5.18 or PR #35221's parent, which have both draft paths; fix: run "
            "`sglang-dcp-dspark coverage` without --draft-path, or with sglang==0.5.18 installed"
        )
    return found


def build_sidecar_pools(g: probes.Geometry) -> probes.PoolPair:
    """Target host pool in a real HostPoolGroup, draft host pool from build_full_draft_pools."""
    build_full_draft_pools = _require(
        "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler", "build_full_draft_pools"
    )
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_pool_entry
    from sglang.srt.mem_cache.memory_pool_host import HostPoolGroup

    target = probes.build_target_host_pool(g)
    target_device = target.device_pool
    group = HostPoolGroup(
        [
            build_pool_entry(
                name=PoolName.KV,
                host_pool=target,
                device_pool=target_device,
                layer_mapping={i: i for i in range(g.target_layers)},
                transfer_layer_num=g.target_layers,
                is_anchor=True,
            )
        ]
    )
    controller = SimpleNamespace(mem_pool_host=group, page_size=g.logical_page_size)
    with probes.unpinned_host_memory():
        _specs, entries = build_full_draft_pools(
            draft_kv_pool=probes.build_draft_device_pool(g),
            tree_cache=SimpleNamespace(cache_controller=controller),
            server_args=_server_args(g),
        )
    return probes.PoolPair(g, target, entries[0].host_pool)


def build_legacy_pools(g: probes.Geometry) -> probes.PoolPair:
    """Target host pool on a controller stand-in, draft host pool from _register_legacy_hicache_draft."""
    register = _require("sglang.srt.mem_cache.kv_cache_builder", "_register_legacy_hicache_draft")
    target = probes.build_target_host_pool(g)
    controller = probes.ControllerStandIn(target)
    with probes.unpinned_host_memory():
        register(
            tree_cache=SimpleNamespace(cache_controller=controller),
            draft_pool=probes.build_draft_device_pool(g),
            server_args=_server_args(g),
            page_size=g.logical_page_size,
        )
    return probes.PoolPair(g, target, controller.mem_pool_host_draft)


def build_pools(path: str, g: probes.Geometry) -> probes.PoolPair:
    if path == "sidecar":
        return build_sidecar_pools(g)
    if path == "legacy":
        return build_legacy_pools(g)
    raise DcpDsparkError(f"unknown draft path {path!r}; expected one of {', '.join(DRAFT_PATHS)}; fix: pass --draft-path sidecar or legacy")
