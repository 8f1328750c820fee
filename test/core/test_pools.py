"""core.pools: the one stand-in pool builder, sglang's own device pool classes at the geometry asked for.

On the meta device a pool of any size costs no memory, and its sizes are
still sglang's (``size``, pages, bytes per token read off its buffers), which
is what preflight, the probes and the sidecar rely on.
"""

from __future__ import annotations

import pytest

from sglang_dcp_dspark.core.pools import device_pool
from sglang_dcp_dspark.core.sizing import MHAKV, MLAKV

DEEPSEEK_V3 = MLAKV(layers=61, kv_lora_rank=512, qk_rope_head_dim=64)  # its public config.json, bf16
DENSE_DRAFT = MHAKV(layers=5, head_num=2, head_dim=64)  # the Kimi-K3 DSPARK draft's geometry


def test_a_full_size_mla_pool_on_meta_allocates_nothing():
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    pool = device_pool(DEEPSEEK_V3, 930_000, 64, meta=True)
    assert type(pool) is MLATokenToKVPool and pool.size == 930_000 and pool.page_size == 64
    buffers = pool.kv_buffer
    assert len(buffers) == 61 and all(b.device.type == "meta" for b in buffers)
    assert buffers[0].shape[-1] == 512 + 64


def test_a_small_pool_on_cpu_is_real():
    pool = device_pool(DEEPSEEK_V3, 64, 16, meta=False)
    assert pool.kv_buffer[0].device.type == "cpu"
    pool.kv_buffer[0][1].fill_(1.0)  # real memory: it can be written
    assert float(pool.kv_buffer[0][1].sum()) == 512 + 64


@pytest.mark.parametrize("meta", [True, False])
def test_a_dense_pool_has_k_and_v_per_head(meta):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    pool = device_pool(DENSE_DRAFT, 128, 16, meta=meta)
    assert type(pool) is MHATokenToKVPool and pool.size == 128
    assert len(pool.k_buffer) == 5 and pool.k_buffer[0].shape[-2:] == (2, 64)
    assert all((b.device.type == "meta") == meta for b in pool.k_buffer + pool.v_buffer)
