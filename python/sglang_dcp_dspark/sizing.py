"""HiCache host-pool sizes under DCP, read off sglang's own pool classes.

No byte formula lives here. Every figure comes from a real
``MLATokenToKVPool`` / ``MLATokenToKVPoolHost`` built at the full geometry,
with tensors on torch's "meta" device so that nothing is allocated: the row
count (ratio or ``--hicache-size``, page alignment), ``logical_size``,
``size_per_token`` and the buffer's byte size are whatever sglang computes.
The draft host pool is created by sglang's own draft registration, stock or
with the plugin's fix, so both sides of the defect are measured the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from types import SimpleNamespace

from . import rules, swap

# The budget split lives in :mod:`rules`; imported here for the callers that size pools with it.
from .rules import BudgetSplit as BudgetSplit

# torch dtypes by --kv-cache-dtype; "auto" follows the model (models.py reads its dtype through ModelConfig;
# bf16 here for callers without one).
KV_DTYPES = {"auto": "bfloat16", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
             "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


@dataclass(frozen=True)
class MLAKV:
    """The per-token MLA KV of one model on one rank."""

    layers: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    dtype: str = "bfloat16"
    kind = "mla"


@dataclass(frozen=True)
class MHAKV:
    """The per-token dense (MHA/GQA) KV of one model on one rank: K and V per KV head per layer.

    ``head_num`` is this rank's share, as sglang splits the KV heads over the
    attention TP group (``ModelConfig.get_num_kv_heads(attn_tp_size)``); DCP
    does not split them further, it replicates a dense draft on every DCP rank.
    """

    layers: int
    head_num: int
    head_dim: int
    v_head_dim: int
    dtype: str = "bfloat16"
    kind = "mha"


def logical_slots(host_pool) -> int:
    """Slots the radix tree addresses in a host pool: ``logical_size``, or one per row before DCP existed."""
    if hasattr(host_pool, "logical_size"):
        return int(host_pool.logical_size)
    return rules.logical_slots(host_pool.size, 1)


@dataclass(frozen=True)
class HostPoolSize:
    """One HiCache host pool on one rank, as sglang sizes it."""

    rows: int  # physical rows this rank stores
    logical_slots: int  # slots the radix tree addresses (rows x dcp_size for the target)
    page_size: int  # physical page
    bytes_per_token: int
    bytes: int  # the pinned buffer

    @classmethod
    def of(cls, pool) -> HostPoolSize:
        # A KV host pool keeps kv_buffer; a DSA indexer host pool its index buffer.
        buffer = getattr(pool, "kv_buffer", None)
        if buffer is None:
            buffer = pool.index_k_with_scale_buffer
        nbytes = sum(b.nbytes for b in buffer) if isinstance(buffer, (list, tuple)) else buffer.nbytes
        return cls(int(pool.size), logical_slots(pool), int(pool.page_size), int(pool.size_per_token), int(nbytes))


@dataclass(frozen=True)
class HiCacheSizing:
    """Target and draft host pools of one DCP rank, with the draft sized stock and fixed."""

    dcp_size: int
    page_size: int  # physical page per rank
    device_rows: int  # target device pool rows per rank
    target: HostPoolSize
    draft_stock: HostPoolSize | None
    draft_fixed: HostPoolSize | None

    @property
    def logical_page_size(self) -> int:
        return self.page_size * self.dcp_size

    def coverage(self, draft: HostPoolSize | None) -> float | None:
        return None if draft is None else rules.coverage(draft.rows, self.target.logical_slots)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["logical_page_size"] = self.logical_page_size
        out["coverage_stock"] = self.coverage(self.draft_stock)
        out["coverage_fixed"] = self.coverage(self.draft_fixed)
        return out


# Tensor constructors that sglang's pool classes call. Under _OnMeta they all
# build meta tensors, whatever device sglang names.
_CONSTRUCTORS = ("empty", "zeros", "ones", "full", "arange", "tensor", "empty_strided", "empty_like", "zeros_like",
                 "ones_like", "full_like")


def _on_meta_mode():
    """A torch function mode that puts every tensor built under it on the meta device.

    sglang's host pools size their bookkeeping by the slots they address:
    ``HostKVCache.clear()`` builds the free-slot list (``arange(logical_size)``),
    ``mem_state`` and ``slot_used`` for real on the CPU, about 10 bytes per
    logical slot, i.e. gigabytes for a full-size DCP launch. None of those
    tensors' values feeds a size (rows, ``logical_size``, ``size_per_token``
    are plain ints, the buffer's bytes are its shape), so building them on
    meta leaves every figure exactly as sglang computes it. A mode rather than
    a replacement ``clear()`` so that whatever per-slot tensor the installed
    sglang's constructors build, in ``clear()`` or elsewhere, follows without
    a copy of sglang's code here; ``test_sizing`` checks that no real tensor
    bigger than a few bytes is built and that the figures match real CPU pools.
    """
    import torch
    from torch.overrides import TorchFunctionMode

    constructors = {getattr(torch, name) for name in _CONSTRUCTORS}

    class _OnMeta(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in constructors:
                kwargs["device"] = "meta"
                kwargs.pop("pin_memory", None)
            return func(*args, **kwargs)

    return _OnMeta()


@contextlib.contextmanager
def _unallocated_host_buffers() -> Iterator[None]:
    """Host pools at full geometry that allocate nothing: no memory, no pinning, no free-RAM check.

    The KV buffers come from sglang's mmap allocator, which no torch mode sees,
    so it is answered with a meta tensor directly; every other tensor the pools
    build goes to meta through :func:`_on_meta_mode`. sglang checks free RAM
    against the pool inside the constructor; preflight sets the bytes against
    the target node's RAM itself, so that check is answered with "plenty" here.
    """
    import torch
    from sglang.srt.mem_cache.pool_host import base, common

    plenty = SimpleNamespace(virtual_memory=lambda: SimpleNamespace(available=1 << 62))
    with swap.attribute(common, "alloc_mmap", lambda dims, dtype: torch.empty(dims, dtype=dtype, device="meta")), \
            swap.attribute(common, "_cuda_host_register", lambda buffer: None), \
            swap.attribute(base, "psutil", plenty), _on_meta_mode():
        yield


def _device_pool(kv: MLAKV, rows: int, page_size: int):
    from ._probes import mla_device_pool

    return mla_device_pool(rows, page_size, kv.layers, kv_lora_rank=kv.kv_lora_rank,
                           qk_rope_head_dim=kv.qk_rope_head_dim, dtype=kv.dtype, device="meta")


def measure(
    target_kv: MLAKV,
    draft_kv: MLAKV | None,
    *,
    dcp_size: int,
    device_rows: int,
    page_size: int,
    hicache_ratio: float,
    hicache_size_gb: float = 0,
    layout: str = "layer_first",
    register_stock: Callable | None = None,
    register_fixed: Callable | None = None,
) -> HiCacheSizing:
    """Build rank 0's pools at full size on the meta device and register the draft both ways."""
    from . import _probes

    geometry = _probes.Geometry(
        dcp_size, layout, device_rows=device_rows, page_size=page_size, host_ratio=hicache_ratio,
        hicache_size_gb=hicache_size_gb,
    )
    with _unallocated_host_buffers():
        target_pool = _probes.build_target_host_pool(geometry, device_pool=_device_pool(target_kv, device_rows, page_size))
        drafts = []
        for register in (register_stock, register_fixed):
            if draft_kv is None or register is None:
                drafts.append(None)
                continue
            # The replicated draft is indexed by logical slots: its device pool has device_rows x dcp rows.
            draft_device = _device_pool(draft_kv, device_rows * dcp_size, page_size * dcp_size)
            kwargs = _probes.draft_registration_args(target_pool, geometry, draft_device_pool=draft_device)
            register(**kwargs)
            draft = kwargs["tree_cache"].cache_controller.mem_pool_host_draft
            drafts.append(None if draft is None else HostPoolSize.of(draft))
    return HiCacheSizing(dcp_size, page_size, device_rows, HostPoolSize.of(target_pool), drafts[0], drafts[1])


def host_bytes_per_token(device_pool) -> int:
    """Bytes per token that sglang's host-pool class charges for mirroring ``device_pool``.

    The host class's own ``get_size_per_token`` runs on an instance that skips
    ``__init__``, so nothing is allocated and the answer follows whatever the
    installed sglang counts (layer sharding, kv_cache_dim overrides, dtype).
    """
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import get_mha_host_pool_cls
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    cls = MLATokenToKVPoolHost if isinstance(device_pool, MLATokenToKVPool) else get_mha_host_pool_cls(device_pool)
    host = object.__new__(cls)
    host.device_pool = device_pool
    host.dtype = device_pool.store_dtype
    host.override_kv_cache_dim = None
    return int(host.get_size_per_token())
