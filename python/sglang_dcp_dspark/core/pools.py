"""sglang's own device pools as stand-ins for one rank's: the one builder preflight, the plugin's probes and the
draft sidecar use.

A pool is the installed release's class (``MLATokenToKVPool``, its DSA
subclass, ``MHATokenToKVPool``) built at the geometry asked for, on the meta
device or with real CPU tensors: host pools, registration and budgets then
read sizes from sglang's own objects, never from a formula of ours.
"""

from __future__ import annotations

import contextlib

from .meta import on_meta_mode
from .sizing import MHAKV, MLAKV


def device_pool(kv: MLAKV | MHAKV, rows: int, page_size: int, *, meta: bool, dsa_index_head_dim: int | None = None):
    """sglang's MLA (or, with ``dsa_index_head_dim``, DSA) or dense device pool of ``rows`` rows.

    ``meta``: every tensor on the meta device (full-size geometries); else
    real CPU tensors (the reduced-scale checks and the probes).
    """
    import torch
    from sglang.srt.mem_cache import memory_pool

    dtype = getattr(torch, kv.dtype)
    if isinstance(kv, MHAKV):
        # Its constructor asks torch for the device's stream module, which "meta" has none of: it is built for
        # "cpu", with every tensor sent to meta where asked.
        extra = {} if kv.v_head_dim is None else {"v_head_dim": kv.v_head_dim}
        with on_meta_mode() if meta else contextlib.nullcontext():
            return memory_pool.MHATokenToKVPool(size=rows, page_size=page_size, dtype=dtype, head_num=kv.head_num,
                                                head_dim=kv.head_dim, layer_num=kv.layers, device="cpu",
                                                enable_memory_saver=False, **extra)
    common = dict(size=rows, page_size=page_size, dtype=dtype, kv_lora_rank=kv.kv_lora_rank,
                  qk_rope_head_dim=kv.qk_rope_head_dim, layer_num=kv.layers, device="meta" if meta else "cpu",
                  enable_memory_saver=False)
    if dsa_index_head_dim:
        return memory_pool.DSATokenToKVPool(index_head_dim=dsa_index_head_dim,
                                            kv_cache_dim=kv.kv_lora_rank + kv.qk_rope_head_dim, **common)
    return memory_pool.MLATokenToKVPool(**common)
