"""The sizing model: host-pool rows and bytes read off sglang's own pool classes at full size, unallocated."""

from __future__ import annotations

import functools
import inspect

import pytest

from sglang_dcp_dspark import hostpool, plugin, sizing

TARGET = sizing.MLAKV(layers=2, kv_lora_rank=512, qk_rope_head_dim=64)
DRAFT = sizing.MLAKV(layers=1, kv_lora_rank=512, qk_rope_head_dim=64)


@pytest.fixture(scope="module")
def registrations():
    from sglang.srt.mem_cache import kv_cache_builder

    stock = inspect.unwrap(kv_cache_builder.maybe_register_hicache_draft)
    return stock, functools.partial(plugin.size_draft_from_logical, stock)


@pytest.mark.parametrize("dcp", [1, 2, 8])
def test_matches_pools_built_for_real(registrations, dcp):
    """The same geometry built with real CPU buffers (hostpool) gives the same rows and bytes."""
    stock, fixed = registrations
    g = hostpool.Geometry(dcp)
    measured = sizing.measure(
        sizing.MLAKV(g.target_layers, g.kv_lora_rank, g.qk_rope_head_dim),
        sizing.MLAKV(g.draft_layers, g.kv_lora_rank, g.qk_rope_head_dim),
        dcp_size=dcp, device_rows=g.device_rows, page_size=g.page_size, hicache_ratio=g.host_ratio,
        register_stock=stock, register_fixed=fixed,
    )
    for register, draft in ((stock, measured.draft_stock), (fixed, measured.draft_fixed)):
        real = hostpool.build_pools(g, register=register)
        assert measured.target.rows == real.target_host_pool.size
        assert measured.target.bytes == real.target_host_pool.kv_buffer.nbytes
        assert draft.rows == real.draft_host_pool.size
        assert draft.bytes == real.draft_host_pool.kv_buffer.nbytes


def test_full_scale_costs_no_memory_and_shows_the_defect(registrations):
    stock, fixed = registrations
    # 400k rows x 61 layers: ~56 GB of target host pool per rank if it were allocated.
    m = sizing.measure(sizing.MLAKV(61, 512, 64), DRAFT, dcp_size=8, device_rows=400_000, page_size=64,
                       hicache_ratio=2.0, register_stock=stock, register_fixed=fixed)
    assert m.target.bytes == m.target.rows * m.target.bytes_per_token > 50e9
    assert m.target.logical_slots == 8 * m.target.rows
    assert m.coverage(m.draft_stock) < 0.2
    assert m.coverage(m.draft_fixed) >= 1.0


def test_hicache_size_sets_target_rows(registrations):
    stock, fixed = registrations
    m = sizing.measure(TARGET, None, dcp_size=2, device_rows=4096, page_size=64, hicache_ratio=2.0, hicache_size_gb=1)
    # sglang rounds the row count up past the next page boundary.
    page_bytes = m.target.bytes_per_token * m.target.page_size
    assert 1e9 <= m.target.bytes <= 1e9 + page_bytes
    assert m.draft_stock is None and m.draft_fixed is None
