"""Both draft paths of PR #35221's form size the draft host pool over the logical slots, on real pools."""

from __future__ import annotations

import pytest

import hostpool
from sglang_dcp_dspark.preflight import draft_paths

DCP_SIZES = (1, 2, 4, 8)


def cases():
    for path in draft_paths.DRAFT_PATHS:
        for dcp in DCP_SIZES:
            # dcp 1 has logical_size == size: the parent and the fix agree there.
            marks = [pytest.mark.regression] if dcp > 1 else []
            yield pytest.param(path, dcp, id=f"{path}-dcp{dcp}", marks=marks)


@pytest.fixture(scope="module")
def pools():
    built: dict[tuple[str, int], hostpool.PoolPair] = {}

    def get(path: str, dcp: int) -> hostpool.PoolPair:
        if (path, dcp) not in built:
            built[path, dcp] = draft_paths.build_pools(path, hostpool.Geometry(dcp))
        return built[path, dcp]

    return get


@pytest.mark.parametrize("path,dcp", list(cases()))
def test_draft_host_pool_covers_the_logical_slots(pools, path, dcp):
    pair = pools(path, dcp)
    target = pair.target_host_pool
    assert pair.draft_host_pool.size >= target.logical_size, (
        f"{path} path at dcp {dcp}: {pair.draft_host_pool.size} draft host rows for "
        f"{target.logical_size} logical slots ({target.size} physical rows); coverage {pair.coverage:.3f}"
    )


@pytest.mark.parametrize("path,dcp", list(cases()))
def test_every_target_slot_indexes_inside_the_draft_buffer(pools, path, dcp):
    pair = pools(path, dcp)
    assert pair.out_of_bounds_slots() == 0


@pytest.mark.parametrize("path", draft_paths.DRAFT_PATHS)
def test_the_draft_host_pool_is_sglangs_own(pools, path):
    """Not a stand-in: the draft is an MLATokenToKVPoolHost with its own buffer, not striped."""
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    pair = pools(path, 8)
    assert type(pair.draft_host_pool) is MLATokenToKVPoolHost
    assert pair.draft_host_pool.dcp_size == 1
    assert pair.target_host_pool.dcp_size == 8
