"""Real sglang 0.5.23 target and draft host pools for one DCP rank, built the way a launch builds them.

The device pools are sglang's ``MLATokenToKVPool`` and the host pools come out
of its own ``build_kv_only_stack`` and ``build_full_draft_pools``, so the
budget, the auto-size estimate and the guard under test are upstream's code,
stock or patched. Every buffer is on torch's "meta" device: the sizes are
computed the same, and a full-scale pool (millions of rows) costs nothing.
Only what needs a GPU is stubbed: cudaHostRegister and the cache
controller's transfer streams.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from unittest import mock

# DeepSeek-V3-like MLA geometry: 576 dims in bf16 is 1,152 bytes per token per layer.
KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
PAGE_SIZE = 64  # physical page per rank; the tree's page is PAGE_SIZE * dcp_size


@dataclass(frozen=True)
class Rank:
    dcp_size: int
    device_rows: int = 1024  # target device pool rows on this rank
    target_layers: int = 2
    draft_layers: int = 1
    hicache_size: int = 0  # GB, as --hicache-size
    hicache_ratio: float = 2.0
    host_memory: int = 1 << 50  # bytes the host budget snapshot allows
    draft_backup: str = "replicated"  # --hicache-draft-backup (upstream-next 0005); "sharded": one stripe per rank


@dataclass
class Pools:
    rank: Rank
    target_device: object
    draft_device: object
    target_host: object | None = None
    draft_host: object | None = None

    @property
    def target_bytes(self) -> int:
        return self.target_host.size * self.target_host.size_per_token

    @property
    def draft_bytes(self) -> int:
        return self.draft_host.size * self.draft_host.size_per_token

    @property
    def pinned_bytes(self) -> int:
        return self.target_bytes + self.draft_bytes

    @property
    def page_bytes(self) -> int:
        """Host bytes of one physical target page together with its draft rows."""
        return PAGE_SIZE * (self.target_host.size_per_token + self.rank.dcp_size * self.draft_host.size_per_token)


def _mla_pool(rows: int, page_size: int, layers: int):
    import torch
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    return MLATokenToKVPool(
        size=rows, page_size=page_size, dtype=torch.bfloat16, kv_lora_rank=KV_LORA_RANK,
        qk_rope_head_dim=QK_ROPE_HEAD_DIM, layer_num=layers, device="meta", enable_memory_saver=False,
    )


@contextlib.contextmanager
def on_rank(rank: Rank) -> Iterator[None]:
    """sglang's runtime config for one DCP rank, with host buffers on the meta device."""
    import torch
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler
    from sglang.srt.mem_cache.pool_host import common
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
    from sglang.srt.runtime_context import get_context, get_parallel

    # The field exists only with patch 0005: left out on replicated, the build is stock 0.5.23's too.
    backup = {} if rank.draft_backup == "replicated" else {"hicache_draft_backup": rank.draft_backup}
    with contextlib.ExitStack() as stack:
        stack.enter_context(get_context().override_server_args(
            hicache_size=rank.hicache_size, hicache_ratio=rank.hicache_ratio, hicache_mem_layout="layer_first",
            dcp_size=rank.dcp_size, tp_size=rank.dcp_size, **backup,
        ))
        # A sharded draft pool keeps the DCP group for its load-back all-gathers; nothing is moved here.
        stack.enter_context(get_parallel().override(attn_dcp_rank=0, dcp_group=mock.MagicMock()))
        # One budget snapshot, as auto-sizing books pools: the check no longer depends on this machine's RAM.
        stack.enter_context(host_memory_budget_scope(rank.host_memory))
        stack.enter_context(mock.patch.object(common, "_cuda_host_register", lambda *a, **k: None))
        # MAP_POPULATE would fault in every byte; the sizes are what is under test.
        stack.enter_context(mock.patch.object(
            common, "alloc_mmap", lambda dims, dtype: torch.empty(dims, dtype=dtype, device="meta")))
        stack.enter_context(mock.patch.object(hybrid_pool_assembler, "HybridCacheController", mock.MagicMock()))
        yield


def device_pools(rank: Rank) -> Pools:
    target = _mla_pool(rank.device_rows, PAGE_SIZE, rank.target_layers)
    # The replicated draft is indexed by the target's virtual locs: dcp_size times the rows, widened pages.
    draft = _mla_pool(rank.device_rows * rank.dcp_size, PAGE_SIZE * rank.dcp_size, rank.draft_layers)
    return Pools(rank, target, draft)


def build(rank: Rank, pools: Pools | None = None) -> Pools:
    """Device pools, then the target host pool and its full draft sidecar, inside ``on_rank``."""
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as assembler

    pools = pools or device_pools(rank)
    params = SimpleNamespace(
        page_size=PAGE_SIZE * rank.dcp_size, token_to_kv_pool_allocator=mock.MagicMock(), tp_cache_group=None,
        attn_cp_cache_group=None, attn_tp_cache_group=None, pp_cache_group=None,
        mtp_draft_device_pools=(), sidecar_draft_device_pools=(pools.draft_device,),
    )
    group, _ = assembler.build_kv_only_stack(
        params=params, kv_pool=pools.target_device, full_layer_mapping={i: i for i in range(rank.target_layers)},
        load_cache_event=None, storage_backend=None, use_mla=True,
    )
    pools.target_host = group.anchor_entry.host_pool
    tree_cache = SimpleNamespace(cache_controller=SimpleNamespace(
        mem_pool_host=group, page_size=PAGE_SIZE * rank.dcp_size, transfer_layer_id_max=rank.target_layers))
    _, entries = assembler.build_full_draft_pools(draft_kv_pool=pools.draft_device, tree_cache=tree_cache)
    pools.draft_host = entries[0].host_pool
    return pools


def auto_size_estimate(pools: Pools) -> int:
    """sglang's auto-size estimate of the host bytes per unit of --hicache-ratio, target plus sidecar draft."""
    from sglang.srt.mem_cache import hicache_auto_size
    from sglang.srt.speculative.base_spec_worker import HiCacheDraftMode, HiCacheDraftPlan

    params = SimpleNamespace(
        token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: pools.target_device),
        req_to_token_pool=None, mtp_draft_device_pools=(),
    )
    plan = HiCacheDraftPlan(mode=HiCacheDraftMode.SIDECAR, device_pools=(pools.draft_device,))
    return int(hicache_auto_size._estimate_hicache_bytes(params, plan))
