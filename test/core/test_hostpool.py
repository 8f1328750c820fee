"""The real-pool probe itself: target geometry as HiRadixCache builds it, and a deliberately small draft detected."""

from __future__ import annotations

import pytest

import hostpool


@pytest.mark.parametrize("dcp", [1, 2, 8])
def test_target_pool_is_striped_over_dcp(dcp):
    target = hostpool.build_target_host_pool(hostpool.Geometry(dcp))
    assert target.dcp_size == dcp
    assert target.logical_page_size == hostpool.PAGE_SIZE * dcp
    assert target.logical_size == target.size * dcp


def test_probe_sees_an_undersized_draft(monkeypatch):
    """A registration that sizes the draft from physical rows is caught, whatever tree is installed."""
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    def physical_rows_registration(*, tree_cache, draft_worker, page_size, server_args, **_):
        pool = draft_worker.draft_worker.draft_runner.token_to_kv_pool
        primary = tree_cache.cache_controller.mem_pool_host
        host = MLATokenToKVPoolHost(
            pool, primary.size / pool.size, 0, page_size, server_args.hicache_mem_layout, pool_label="draft"
        )
        tree_cache.cache_controller.set_draft_kv_pool(pool, host)

    pair = hostpool.build_pools(hostpool.Geometry(4), register=physical_rows_registration)
    assert pair.coverage < 0.3
    # A fresh host pool hands out slots 0, 1, 2, ...: all at or past the draft's end are out of bounds.
    assert pair.out_of_bounds_slots() == len(pair.allocatable_slots()) - pair.draft_host_pool.size > 0
    with pytest.raises(IndexError):
        hostpool.touch_draft_rows(pair)
