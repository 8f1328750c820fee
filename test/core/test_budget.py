"""The draft-aware budget model and its start-up checks, against real sglang host pools at reduced scale."""

from __future__ import annotations

import logging

import pytest

import hostpool
from sglang_dcp_dspark.core import budget
from sglang_dcp_dspark.core.sizing import BudgetSplit, host_bytes_per_token

BUDGET = 40_000_000  # bytes per rank: real CPU buffers, a few tens of MB


@pytest.mark.parametrize("layers", [1, 2, 61])
def test_bytes_per_token_is_what_the_host_pool_charges(layers):
    g = hostpool.Geometry(2, target_layers=layers, device_rows=64)
    target = hostpool.build_target_host_pool(g)
    assert host_bytes_per_token(target.device_pool) == target.size_per_token


def build_with_target_share(dcp: int, target_bytes: int, draft_kind: str = "mla") -> hostpool.PoolPair:
    """Target sized by --hicache-size = target_bytes, draft by the fixed registration, as sglang builds them."""
    from sglang.srt.mem_cache import kv_cache_builder

    from sglang_dcp_dspark.plugin.hooks.kv_cache_builder import fixed_registration

    g = hostpool.Geometry(dcp, hicache_size_gb=target_bytes / 1e9, draft_kind=draft_kind)
    return hostpool.build_pools(g, register=fixed_registration(kv_cache_builder.maybe_register_hicache_draft))


def pinned(pair: hostpool.PoolPair) -> int:
    return sum(int(p.size) * int(p.size_per_token) for p in (pair.target_host_pool, pair.draft_host_pool))


def split_for(dcp: int, draft_kind: str = "mla") -> BudgetSplit:
    pair = hostpool.build_pools(hostpool.Geometry(dcp, device_rows=64, draft_kind=draft_kind))
    return BudgetSplit(
        BUDGET,
        pair.target_host_pool.size_per_token,
        pair.draft_host_pool.size_per_token,
        dcp,
        hostpool.PAGE_SIZE,
    )


# "mha": the dense DSPARK draft (DSparkDraftModel), with its own MHATokenToKVPoolHost.
@pytest.mark.parametrize("draft_kind", ["mla", "mha"], ids=["mla-draft", "dense-dspark-draft"])
@pytest.mark.parametrize("dcp", [1, 2, 4, 8, 16])
def test_split_fits_real_pools_inside_the_budget(dcp, draft_kind):
    split = split_for(dcp, draft_kind)
    pair = build_with_target_share(dcp, split.target_budget_bytes, draft_kind)
    assert pinned(pair) <= BUDGET
    assert split.target_rows <= pair.target_host_pool.size <= split.target_rows + hostpool.PAGE_SIZE
    assert pair.draft_host_pool.size >= pair.target_host_pool.logical_size
    # What is held back for page rounding is all that goes unused.
    assert BUDGET - pinned(pair) <= split.rounding_bytes + split.bytes_per_target_row


@pytest.mark.parametrize("dcp", [2, 8])
def test_share_without_the_dcp_factor_overshoots(dcp):
    """PR #35875's t / (t + d) share: under DCP the draft it did not count is pinned anyway."""
    split = split_for(dcp)
    pair = build_with_target_share(dcp, int(BUDGET * split.share_without_dcp))
    # Each target row brings dcp draft rows, not one: (t + dcp d) / (t + d) of the budget.
    overshoot = split.bytes_per_target_row / (split.target_bytes_per_token + split.draft_bytes_per_token)
    assert pinned(pair) == pytest.approx(BUDGET * overshoot, rel=0.05)
    assert pinned(pair) > BUDGET


def test_split_reduces_to_the_target_alone_without_a_draft_cost():
    split = BudgetSplit(10_000, 100, 0, 8)
    assert (split.target_share, split.target_rows, split.draft_budget_bytes) == (1.0, 100, 0)


def stand_in(dcp: int, **args):
    g = hostpool.Geometry(dcp)
    return hostpool.scheduler_stand_in(g, hostpool.server_args_for(g, **args))


def free_for(scheduler, smallest_factor: float) -> int:
    from sglang.srt.mem_cache.pool_host.base import HICACHE_HOST_MEMORY_RESERVE_BYTES

    target = scheduler.tp_worker.model_runner.token_to_kv_pool
    draft = scheduler.draft_worker.draft_worker.draft_runner.token_to_kv_pool
    dcp = scheduler.server_args.dcp_size
    smallest = target.size * (host_bytes_per_token(target) + dcp * host_bytes_per_token(draft))
    return HICACHE_HOST_MEMORY_RESERVE_BYTES + int(budget.local_ranks(scheduler.server_args) * smallest * smallest_factor)


def test_too_little_ram_is_one_line_with_the_numbers():
    scheduler = stand_in(8)
    with pytest.raises(budget.HostMemoryTooSmall) as err:
        budget.fit_hicache_size(scheduler, available_bytes=free_for(scheduler, 0.9))
    message = str(err.value)
    assert "\n" not in message and "dcp_size 8" in message and "8 ranks per host" in message and "fix:" in message


def test_ranks_per_host_divide_free_ram():
    scheduler = stand_in(8, nnodes=2)  # 8 ranks over 2 hosts: 4 share this one
    assert budget.local_ranks(scheduler.server_args) == 4
    budget.fit_hicache_size(scheduler, available_bytes=free_for(scheduler, 1.0))


def test_ratio_that_overshoots_free_ram_warns_with_a_size_that_fits(caplog):
    scheduler = stand_in(4, hicache_ratio=2.0)
    with caplog.at_level(logging.WARNING, logger="sglang_dcp_dspark.core.budget"):
        assert budget.fit_hicache_size(scheduler, available_bytes=free_for(scheduler, 1.5)) is None
    assert any("set --hicache-size" in r.getMessage() for r in caplog.records)


def test_budget_applied_and_logged(caplog):
    scheduler = stand_in(4, hicache_size=0.05)
    with caplog.at_level(logging.INFO, logger="sglang_dcp_dspark.core.budget"):
        split = budget.fit_hicache_size(scheduler, available_bytes=1 << 40)
    assert scheduler.server_args.hicache_size == split.target_budget_bytes / 1e9 < 0.05
    assert any("counts the draft at dcp_size 4" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("value,off", [("1", True), ("true", True), ("0", False), ("", False)])
def test_unbudgeted_switch(monkeypatch, value, off):
    monkeypatch.setenv(budget.UNBUDGETED_ENV, value)
    assert budget.unbudgeted() is off
    scheduler = stand_in(2, hicache_size=0.05)
    budget.fit_hicache_size(scheduler, available_bytes=1 << 40)
    assert (scheduler.server_args.hicache_size == 0.05) is off


def test_no_draft_no_change():
    scheduler = stand_in(2, hicache_size=0.05)
    scheduler.draft_worker = None
    assert budget.fit_hicache_size(scheduler, available_bytes=1) is None
    assert scheduler.server_args.hicache_size == 0.05
