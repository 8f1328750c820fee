"""Host memory: --hicache-size holds target and draft together, the total is logged, and a launch that cannot fit stops early."""

from __future__ import annotations

import logging

import psutil
import pytest

import hostpool
from sglang_dcp_dspark.core.sizing import host_bytes_per_token

BUDGET_GB = 0.05  # small enough to allocate for real on CPU


def pinned(pair: hostpool.PoolPair) -> int:
    return sum(int(p.size) * int(p.size_per_token) for p in (pair.target_host_pool, pair.draft_host_pool))


@pytest.mark.regression
@pytest.mark.parametrize("dcp", [1, 2, 4, 8])
def test_hicache_size_holds_target_and_draft(dcp):
    pair, _ = hostpool.start_hicache(hostpool.Geometry(dcp, hicache_size_gb=BUDGET_GB))
    budget = int(BUDGET_GB * 1e9)
    assert pinned(pair) <= budget, f"pins {pinned(pair)} bytes for a {budget}-byte --hicache-size"
    # Not bought by starving the cache: at most the page rounding is left unused.
    assert pinned(pair) >= 0.85 * budget
    assert pair.out_of_bounds_slots() == 0


def test_unbudgeted_switch_keeps_the_target_at_the_full_budget(monkeypatch):
    """SGLANG_HICACHE_SIZE_EXCLUDES_DRAFT=1 gives every tree sglang's own sizing of the target."""
    monkeypatch.setenv("SGLANG_HICACHE_SIZE_EXCLUDES_DRAFT", "1")
    g = hostpool.Geometry(4, hicache_size_gb=BUDGET_GB)
    pair, args = hostpool.start_hicache(g)
    assert args.hicache_size == BUDGET_GB
    assert pair.target_host_pool.size == hostpool.build_target_host_pool(g).size


@pytest.mark.regression
def test_pinned_total_is_logged_once_under_hicache_ratio(caplog):
    with caplog.at_level(logging.INFO):
        pair, _ = hostpool.start_hicache(hostpool.Geometry(8))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("HiCache pins")]
    assert len(lines) == 1, f"expected one 'HiCache pins' line, got {lines}"
    assert f"{pair.draft_host_pool.size} rows" in lines[0] and "dcp_size 8" in lines[0]


@pytest.mark.regression
def test_host_pools_that_cannot_fit_stop_startup_before_pinning(monkeypatch):
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.pool_host.base import HICACHE_HOST_MEMORY_RESERVE_BYTES

    g = hostpool.Geometry(8)
    scheduler = hostpool.scheduler_stand_in(g)
    target = scheduler.tp_worker.model_runner.token_to_kv_pool
    draft = scheduler.draft_worker.draft_worker.draft_runner.token_to_kv_pool
    smallest = target.size * (host_bytes_per_token(target) + g.dcp_size * host_bytes_per_token(draft))
    ranks = scheduler.server_args.tp_size  # all on one host
    free = HICACHE_HOST_MEMORY_RESERVE_BYTES + ranks * smallest - 1
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=free))
    try:
        Scheduler.init_memory_pools(scheduler)
    except Exception as exc:
        message = str(exc)
    else:
        raise AssertionError("a launch whose host pools cannot fit in free RAM went on to pin them")
    assert "\n" not in message and "pinned per rank" in message and "dcp_size 8" in message
    assert f"{smallest / 1e9:.2f} GB" in message
