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

from dataclasses import asdict, dataclass

from . import rules

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
    v_head_dim: int | None = None  # None: sglang's default, head_dim
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
