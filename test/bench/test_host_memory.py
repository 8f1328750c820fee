"""bench/host_memory.py: its three setups agree with real host pools built at reduced scale."""

from __future__ import annotations

import pytest

import hostpool
from sglang_dcp_dspark.core import sizing
from trees import load_bench

DCP = 2
DEVICE_ROWS = 1024
PAGE = 64
# Small enough that the real CPU buffers below are a few MB, large enough for many pages.
BUDGET_GB = 0.01


@pytest.fixture(scope="module")
def bench():
    return load_bench("host_memory")


@pytest.fixture(scope="module")
def case(bench):
    stock, fixed = bench.registrations()
    model = bench.Model("small", "test", sizing.MLAKV(2, 512, 64), sizing.MLAKV(1, 512, 64))
    rows = bench.measure_case(model, DCP, budget_gb=BUDGET_GB, device_rows=DEVICE_ROWS, page_size=PAGE,
                              stock=stock, fixed=fixed)
    return {r.setup: r for r in rows}, stock, fixed


def _real(register, hicache_size_gb: float) -> hostpool.PoolPair:
    g = hostpool.Geometry(DCP, device_rows=DEVICE_ROWS, page_size=PAGE, hicache_size_gb=hicache_size_gb,
                          target_layers=2, draft_layers=1)
    return hostpool.build_pools(g, register=register)


def _assert_same(row, pair: hostpool.PoolPair) -> None:
    target, draft = pair.target_host_pool, pair.draft_host_pool
    assert row.target_rows == target.size
    assert row.logical_slots == target.logical_size
    assert row.draft_rows == draft.size
    assert row.target_bytes == target.kv_buffer.nbytes
    assert row.draft_bytes == draft.kv_buffer.nbytes
    assert row.per_rank_bytes == target.kv_buffer.nbytes + draft.kv_buffer.nbytes
    assert row.coverage == pytest.approx(pair.coverage)


def test_setups_cover_all_three(bench, case):
    rows, _, _ = case
    assert set(rows) == set(bench.SETUPS)


def test_stock_matches_real_pools_and_is_out_of_bounds(case):
    rows, stock, _ = case
    pair = _real(stock, BUDGET_GB)
    _assert_same(rows["stock-0.5.17"], pair)
    # About 1/dcp: sglang aligns the draft up by one logical page.
    assert rows["stock-0.5.17"].coverage == pytest.approx(1 / DCP, abs=PAGE * DCP / pair.target_host_pool.logical_size)
    assert pair.out_of_bounds_slots() > 0


def test_unbudgeted_fix_covers_but_pins_over_budget(case):
    rows, _, fixed = case
    pair = _real(fixed, BUDGET_GB)
    row = rows["0.5.18+"]
    _assert_same(row, pair)
    assert row.coverage >= 1 and pair.out_of_bounds_slots() == 0
    assert row.target_rows == rows["stock-0.5.17"].target_rows
    assert row.per_rank_bytes > row.budget_bytes and not row.fits_budget


def test_this_project_covers_within_budget(bench, case):
    rows, _, fixed = case
    row = rows["this-project"]
    # The split as the plugin makes it at startup: bytes per token read off the real device pools.
    unbudgeted = _real(fixed, BUDGET_GB)
    t = sizing.host_bytes_per_token(unbudgeted.target_host_pool.device_pool)
    d = sizing.host_bytes_per_token(unbudgeted.draft_host_pool.device_pool)
    split = sizing.BudgetSplit(row.budget_bytes, t, d, DCP, PAGE)
    pair = _real(fixed, split.target_budget_bytes / bench.GB)
    _assert_same(row, pair)
    assert row.coverage >= 1 and pair.out_of_bounds_slots() == 0
    assert row.per_rank_bytes <= row.budget_bytes and row.fits_budget
    assert row.target_rows < rows["0.5.18+"].target_rows


def test_per_node_is_eight_ranks(case):
    rows, _, _ = case
    for row in rows.values():
        assert row.per_node_bytes == row.ranks_per_node * row.per_rank_bytes
