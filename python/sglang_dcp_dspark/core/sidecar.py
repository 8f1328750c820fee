"""sglang's own HiCache pools of one DCP rank on the sidecar path (0.5.19 and later), on the meta device.

From 0.5.19 a HiCache launch builds its host pools inside sglang's runtime
context: ``build_kv_only_stack`` makes the target's ``MLATokenToKVPoolHost``
(the anchor of a ``HostPoolGroup``) and ``build_full_draft_pools`` the draft
sidecar beside it, both reading ``get_memory()`` and ``get_parallel()``
rather than a ``server_args`` argument. :func:`build` calls those two
functions of the imported tree, stock, patched or hooked by the plugin,
around sglang's own device pools, so every row and byte is sglang's figure.

What stands in for a GPU node, and only while :func:`on_rank` is entered:

- a published configuration for one rank (``override_server_args``, sglang's
  own scoped override) and the rank within the DCP group;
- host buffers on torch's meta device: sglang's mmap allocator and
  ``cudaHostRegister`` are answered without allocating or pinning, and the
  free-RAM check is answered from a budget given by the caller
  (``host_memory_budget_scope`` from 0.5.21; a stand-in for ``psutil`` before);
- the cache controller, which owns CUDA streams and is not under test;
- the other ranks: sizes sglang agrees on with collectives are this rank's own.

Used by the plugin's probes (tiny pools), preflight (full-size pools) and
the tests; nothing here is imported by ``plugin.register`` itself.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

from . import swap

ASSEMBLER = "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler"
# Plenty: sizes, not this machine's RAM, are what a build here is for.
PLENTY = 1 << 60


@dataclass(frozen=True)
class Rank:
    """One DCP rank's launch, as the fields sglang's builders read."""

    dcp_size: int
    device_rows: int = 1024  # target device pool rows on this rank
    page_size: int = 64  # physical page; the tree's page is page_size * dcp_size
    target_layers: int = 2
    draft_layers: int = 1  # 0: no draft
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    dtype: str = "bfloat16"
    draft_kind: str = "mla"  # "mla" or "mha" (an external dense draft)
    hicache_size: float = 0  # GB, as --hicache-size
    hicache_ratio: float = 2.0
    layout: str = "layer_first"
    host_memory: int = PLENTY  # bytes the host budget allows this rank
    dcp_rank: int = 0
    tp_size: int | None = None  # default: dcp_size
    extra: dict = field(default_factory=dict)  # further ServerArgs fields (a patched tree's own switches)
    # Per-slot bookkeeping (free lists sized by the logical slots) on meta too: preflight's full-size
    # pools. Off for the tests and probes, whose pools are then usable the way sglang made them.
    meta_bookkeeping: bool = False
    meta_buffers: bool = True  # False: real CPU host buffers (the reduced-scale cross-checks)


@dataclass
class Pools:
    rank: Rank
    target_device: object
    draft_device: object | None
    group: object | None = None  # the HostPoolGroup
    target_host: object | None = None
    draft_host: object | None = None
    entries: list = field(default_factory=list)  # every sidecar entry build_full_draft_pools returned


def optional_module(name: str):
    """``name`` imported, or None where this release does not have it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def stand_in_host_memory(stack: contextlib.ExitStack, available: Callable[[], int] | None,
                         alloc: Callable[[Callable], Callable] | None = None) -> None:
    """sglang's host pools built without pinning, for the block ``stack`` holds.

    CUDA host registration is off; ``alloc``, given sglang's ``alloc_mmap``,
    returns what replaces it (None: sglang's own); psutil's free RAM is
    answered by ``available()`` where a release checks it (None: psutil is
    left alone, as from 0.5.21, where one budget books every pool).
    """
    common = optional_module("sglang.srt.mem_cache.pool_host.common")
    if common is not None and hasattr(common, "_cuda_host_register"):
        stack.enter_context(swap.attribute(common, "_cuda_host_register", lambda *a, **k: None))
    if alloc is not None and common is not None and hasattr(common, "alloc_mmap"):
        # MAP_POPULATE would fault in every byte; the sizes are what is measured.
        stack.enter_context(swap.attribute(common, "alloc_mmap", alloc(common.alloc_mmap)))
    if available is None:
        return
    node = SimpleNamespace(virtual_memory=lambda: SimpleNamespace(available=available()))
    for module in (optional_module("sglang.srt.mem_cache.pool_host.base"),
                   optional_module("sglang.srt.mem_cache.memory_pool_host")):
        if module is not None and hasattr(module, "psutil"):
            stack.enter_context(swap.attribute(module, "psutil", node))


@contextlib.contextmanager
def on_rank(rank: Rank) -> Iterator[None]:
    """sglang's runtime configuration for one DCP rank, with host buffers on the meta device."""
    import torch
    from sglang.srt.runtime_context import get_context, get_parallel

    # Host bytes this rank's pools have allocated so far: before 0.5.21 each pool
    # checks psutil's free RAM when it is built, and on a node that figure falls
    # by every pool already pinned, so a later pool (the draft) can be refused.
    pinned = [0]

    def counted(alloc):
        def allocate(dims, dtype):
            buffer = alloc(dims, dtype)
            pinned[0] += buffer.numel() * buffer.element_size()
            return buffer

        return allocate

    def meta_buffer(dims, dtype):
        return torch.empty(dims, dtype=dtype, device="meta")

    with contextlib.ExitStack() as stack:
        stack.enter_context(get_context().override_server_args(**{
            "hicache_size": rank.hicache_size, "hicache_ratio": rank.hicache_ratio, "hicache_mem_layout": rank.layout,
            "dcp_size": rank.dcp_size, "tp_size": rank.tp_size or rank.dcp_size, **rank.extra,
        }))
        # The DCP width and rank, stated: up to 0.5.19 a published config with
        # no DCP group reads as dcp off, width 1, and builds an unstriped pool
        # without a word. A sharded draft pool keeps the DCP group for its
        # load-back all-gathers; nothing is moved here.
        stack.enter_context(get_parallel().override(
            dcp_enabled=rank.dcp_size > 1, attn_dcp_size=rank.dcp_size, attn_dcp_rank=rank.dcp_rank,
            dcp_group=swap.Inert(),
        ))
        base = importlib.import_module("sglang.srt.mem_cache.pool_host.base")
        if hasattr(base, "host_memory_budget_scope"):  # 0.5.21 on: one budget snapshot books every pool
            stack.enter_context(base.host_memory_budget_scope(rank.host_memory))
        free = None
        if hasattr(base, "psutil"):  # before: free RAM from psutil, less sglang's reserve, at construction
            available = rank.host_memory + getattr(base, "HICACHE_HOST_MEMORY_RESERVE_BYTES", 0)

            def free():
                return available - pinned[0]

        stand_in_host_memory(stack, free, lambda real: counted(meta_buffer if rank.meta_buffers else real))
        stack.enter_context(swap.attribute(importlib.import_module(ASSEMBLER), "HybridCacheController", swap.Inert()))
        # A lone rank: sglang agrees sizes with its peers through collectives (the auto-sized
        # ratio, a fixed --hicache-size across PP stages) once torch.distributed is up, and
        # every peer computes the same figure. Pools built here are this process's alone,
        # so no collective may run for them, whatever groups the process has.
        stack.enter_context(swap.attribute(torch.distributed, "is_initialized", lambda: False))
        if rank.meta_bookkeeping:
            from .meta import on_meta_mode

            stack.enter_context(on_meta_mode())
        yield


def _device_pool(rows: int, page_size: int, layers: int, rank: Rank, kind: str = "mla"):
    from . import pools
    from .sizing import MHAKV, MLAKV

    if kind == "mha":
        # A dense draft with the MLA row's width in one head, K and V each.
        kv = MHAKV(layers, 1, rank.kv_lora_rank + rank.qk_rope_head_dim, dtype=rank.dtype)
    else:
        kv = MLAKV(layers, rank.kv_lora_rank, rank.qk_rope_head_dim, rank.dtype)
    return pools.device_pool(kv, rows, page_size, meta=True)


def device_pools(rank: Rank) -> Pools:
    target = _device_pool(rank.device_rows, rank.page_size, rank.target_layers, rank)
    draft = None
    if rank.draft_layers:
        # The replicated draft is indexed by the target's virtual locs: dcp_size times the rows, widened pages.
        draft = _device_pool(rank.device_rows * rank.dcp_size, rank.page_size * rank.dcp_size, rank.draft_layers,
                             rank, rank.draft_kind)
    return Pools(rank, target, draft)


def cache_params(pools: Pools, **fields) -> SimpleNamespace:
    """The CacheInitParams fields the plain-KV stack reads (``sidecar_draft_device_pools`` from 0.5.23 on)."""
    params = dict(
        page_size=pools.rank.page_size * pools.rank.dcp_size, token_to_kv_pool_allocator=swap.Inert(),
        tp_cache_group=None, attn_cp_cache_group=None, attn_tp_cache_group=None, pp_cache_group=None,
        mtp_draft_device_pools=(), sidecar_draft_device_pools=(pools.draft_device,) if pools.draft_device else (),
    )
    params.update(fields)
    return SimpleNamespace(**params)


def build(rank: Rank, pools: Pools | None = None, params: SimpleNamespace | None = None) -> Pools:
    """Device pools, then the target host pool and its full draft sidecar; call inside :func:`on_rank`."""
    assembler = importlib.import_module(ASSEMBLER)
    pools = pools or device_pools(rank)
    group, _ = assembler.build_kv_only_stack(
        params=params or cache_params(pools), kv_pool=pools.target_device,
        full_layer_mapping={i: i for i in range(rank.target_layers)}, load_cache_event=None, storage_backend=None,
        use_mla=True,
    )
    pools.group = group
    pools.target_host = group.anchor_entry.host_pool
    if pools.draft_device is not None:
        tree_cache = SimpleNamespace(cache_controller=SimpleNamespace(
            mem_pool_host=group, page_size=rank.page_size * rank.dcp_size, transfer_layer_id_max=rank.target_layers))
        _, pools.entries = assembler.build_full_draft_pools(draft_kv_pool=pools.draft_device, tree_cache=tree_cache)
        pools.draft_host = pools.entries[0].host_pool if pools.entries else None
    return pools


def built(rank: Rank, **kwargs) -> Pools:
    """:func:`build` inside :func:`on_rank`."""
    with on_rank(rank):
        return build(rank, **kwargs)
