"""Real sglang HiCache pools on CPU, for the plugin's probes and the ``coverage`` command.

Private: what the plugin asks of sglang before it hooks it. Nothing here
models sglang: it builds sglang's own ``MLATokenToKVPool`` and
``MLATokenToKVPoolHost`` objects (device "cpu", pinned memory off) and
registers the draft through whatever ``maybe_register_hicache_draft`` the
imported sglang has, stock, patched or hooked by the plugin. Only the objects
around the pools that need a GPU scheduler are stand-ins: the tree cache, its
cache controller and the draft worker. Helpers only tests use live in
``test/pools.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace

from . import pools, swap
from .sizing import MHAKV, MLAKV

# MLA KV geometry of DeepSeek-V2/V3 (kv_lora_rank 512 + rope 64), small enough
# in rows that every dcp up to 16 builds in well under a second on CPU.
KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
PAGE_SIZE = 64  # physical page per rank; the logical (widened) page is PAGE_SIZE * dcp
DEVICE_ROWS = 1024  # target device pool rows per rank
HOST_RATIO = 2.0  # --hicache-ratio
TARGET_LAYERS = 2
DRAFT_LAYERS = 1
# A dense DSPARK draft (DSparkDraftModel) per rank: 2 KV heads of head_dim 64,
# the Kimi-K3 DSPARK draft's 16 KV heads over --tp 8.
DENSE_DRAFT_HEADS = 2
DENSE_DRAFT_HEAD_DIM = 64
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")


@dataclass(frozen=True)
class Geometry:
    dcp_size: int
    layout: str = "layer_first"
    device_rows: int = DEVICE_ROWS
    page_size: int = PAGE_SIZE
    host_ratio: float = HOST_RATIO
    hicache_size_gb: float = 0.0  # --hicache-size; 0 sizes from host_ratio
    target_layers: int = TARGET_LAYERS
    draft_layers: int = DRAFT_LAYERS
    kv_lora_rank: int = KV_LORA_RANK
    qk_rope_head_dim: int = QK_ROPE_HEAD_DIM
    # "mla": an MLA draft (a NextN layer's shape); "mha": a dense DSPARK draft (MHATokenToKVPool)
    draft_kind: str = "mla"

    @property
    def logical_page_size(self) -> int:
        return self.page_size * self.dcp_size


@dataclass
class PoolPair:
    geometry: Geometry
    target_host_pool: object  # MLATokenToKVPoolHost, dcp-striped
    draft_host_pool: object | None  # MLATokenToKVPoolHost, replicated (dcp_size 1)

    @property
    def coverage(self) -> float:
        """Draft host rows as a share of the target's logical slots."""
        return self.draft_host_pool.size / self.target_host_pool.logical_size

    def allocatable_slots(self):
        """Every logical slot the target host pool can hand out, in whole logical pages."""
        target = self.target_host_pool
        target.clear()
        slots = target.alloc(target.logical_size - target.logical_size % target.logical_page_size)
        target.clear()
        return slots

    def draft_rows_for(self, slots):
        """The draft host rows that logical slots index (the draft has dcp_size 1: the slots themselves).

        Asked of sglang's own translation, which 0.5.18 renamed from
        ``dcp_kernel_indices`` to ``maybe_dcp_kernel_indices``.
        """
        draft = self.draft_host_pool
        translate = getattr(draft, "dcp_kernel_indices", None) or draft.maybe_dcp_kernel_indices
        return translate(slots)

    def out_of_bounds_slots(self) -> int:
        """Logical slots the target host pool hands out that the draft buffer cannot index.

        The draft host pool has dcp_size 1, so its kernel index is the logical
        slot itself; every such slot is a write past the end of the draft
        buffer when L1 eviction backs the draft KV up to host.
        """
        rows = self.draft_rows_for(self.allocatable_slots())
        return int((rows >= self.draft_host_pool.size).sum())


def _device_pool(g: Geometry, rows: int, page_size: int, layers: int):
    return pools.device_pool(MLAKV(layers, g.kv_lora_rank, g.qk_rope_head_dim), rows, page_size, meta=False)


def build_target_host_pool(g: Geometry, device_pool=None, hicache_size_gb: float | None = None):
    """The target's HiCache host pool as HiRadixCache builds it for one DCP rank."""
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    if device_pool is None:
        device_pool = _device_pool(g, g.device_rows, g.page_size, g.target_layers)
    return MLATokenToKVPoolHost(
        device_pool,
        g.host_ratio,
        g.hicache_size_gb if hicache_size_gb is None else hicache_size_gb,
        g.logical_page_size,  # HiRadixCache passes the widened page
        g.layout,
        pin_memory=False,
        device="cpu",
        dcp_size=g.dcp_size,
        dcp_rank=0,
    )


class ControllerStandIn:
    """The part of HiCacheController that draft registration talks to."""

    def __init__(self, target_host_pool) -> None:
        self.mem_pool_host = target_host_pool
        self.page_size = target_host_pool.logical_page_size
        self.mem_pool_device_draft = None
        self.mem_pool_host_draft = None

    def set_draft_kv_pool(self, draft_device_pool, draft_host_pool) -> None:
        self.mem_pool_device_draft = draft_device_pool
        self.mem_pool_host_draft = draft_host_pool


def build_draft_device_pool(g: Geometry):
    # The replicated draft is indexed by the target's logical slots.
    rows = g.device_rows * g.dcp_size
    if g.draft_kind == "mha":
        return pools.device_pool(MHAKV(g.draft_layers, DENSE_DRAFT_HEADS, DENSE_DRAFT_HEAD_DIM), rows,
                                 g.logical_page_size, meta=False)
    return _device_pool(g, rows, g.logical_page_size, g.draft_layers)


def draft_worker(draft_device_pool) -> SimpleNamespace:
    """The draft worker as the scheduler holds it: V2 workers nest the runner under ``draft_worker``."""
    runner = SimpleNamespace(token_to_kv_pool=draft_device_pool)
    return SimpleNamespace(draft_worker=SimpleNamespace(draft_runner=runner), alloc_memory_pool=lambda **_: None)


def server_args_for(g: Geometry, **overrides) -> SimpleNamespace:
    """The ServerArgs fields that HiCache sizing and draft registration read."""
    fields = dict(
        enable_hierarchical_cache=True,
        enable_multi_layer_eagle=False,
        hicache_mem_layout=g.layout,
        hicache_storage_backend=None,
        hicache_ratio=g.host_ratio,
        hicache_size=g.hicache_size_gb,
        dcp_size=g.dcp_size,
        tp_size=g.dcp_size,
        pp_size=1,
        nnodes=1,
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


def draft_registration_args(target_host_pool, g: Geometry, draft_device_pool=None) -> dict:
    """Keyword arguments for ``maybe_register_hicache_draft`` around real pools."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return dict(
        tree_cache=SimpleNamespace(cache_controller=ControllerStandIn(target_host_pool)),
        draft_worker=draft_worker(draft_device_pool if draft_device_pool is not None else build_draft_device_pool(g)),
        spec_algorithm=SpeculativeAlgorithm.DSPARK,
        server_args=server_args_for(g),
        enable_hierarchical_cache=True,
        page_size=g.logical_page_size,
    )


def scheduler_stand_in(g: Geometry, server_args=None) -> SimpleNamespace:
    """What ``Scheduler.init_memory_pools`` touches, around real device pools.

    Loading weights and allocating on a GPU are the steps skipped: the device
    pools are built directly, and the workers' allocation calls do nothing.
    """
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    target_device_pool = _device_pool(g, g.device_rows, g.page_size, g.target_layers)
    runner = SimpleNamespace(token_to_kv_pool=target_device_pool, memory_pool_config=None)
    return SimpleNamespace(
        server_args=server_args if server_args is not None else server_args_for(g),
        spec_algorithm=SpeculativeAlgorithm.DSPARK,
        enable_hierarchical_cache=True,
        init_target_memory_pool=lambda: None,
        tp_worker=SimpleNamespace(model_runner=runner, get_memory_pool=lambda: (None, None)),
        draft_worker=draft_worker(build_draft_device_pool(g)),
    )


@contextlib.contextmanager
def unpinned_host_memory() -> Iterator[None]:
    """Let host pools that ask for pinned memory allocate plain CPU tensors.

    The draft registration always pins (cudaHostRegister), which needs a CUDA
    driver; on CPU the registration is the only GPU step, so it alone is skipped.
    """
    from sglang.srt.mem_cache.pool_host import common

    with swap.attribute(common, "_cuda_host_register", lambda buffer: None):
        yield


def build_pools(g: Geometry, register: Callable | None = None) -> PoolPair:
    """Target host pool plus the draft host pool that ``register`` creates for it.

    ``register`` defaults to the imported sglang's ``maybe_register_hicache_draft``
    looked up at call time, so a patched tree or an applied plugin hook is what runs.
    """
    if register is None:
        from sglang.srt.mem_cache import kv_cache_builder

        register = kv_cache_builder.maybe_register_hicache_draft
    target = build_target_host_pool(g)
    kwargs = draft_registration_args(target, g)
    with unpinned_host_memory():
        register(**kwargs)
    return PoolPair(g, target, kwargs["tree_cache"].cache_controller.mem_pool_host_draft)
