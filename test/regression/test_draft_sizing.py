"""Draft HiCache host pool sizing on real sglang pools: it must cover the target's logical slots."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

import hostpool

DCP_SIZES = (1, 2, 3, 4, 8)
# dcp 1 has logical_size == size: stock and fixed agree there.
regression_at = lambda dcp: [pytest.mark.regression] if dcp > 1 else []  # noqa: E731


def cases():
    for dcp in DCP_SIZES:
        for layout in hostpool.MLA_LAYOUTS:
            yield pytest.param(dcp, layout, id=f"dcp{dcp}-{layout}", marks=regression_at(dcp))


@pytest.fixture(scope="module")
def pools():
    built: dict[tuple[int, str], hostpool.PoolPair] = {}

    def get(dcp: int, layout: str) -> hostpool.PoolPair:
        if (dcp, layout) not in built:
            built[dcp, layout] = hostpool.build_pools(hostpool.Geometry(dcp, layout))
        return built[dcp, layout]

    return get


def assert_every_slot_inside(pair: hostpool.PoolPair, what: str = "draft") -> None:
    """No logical slot of the target falls past the draft host pool, counted and by indexing its real buffer."""
    assert pair.out_of_bounds_slots() == 0, (
        f"{pair.out_of_bounds_slots()} of {pair.target_host_pool.logical_size} logical slots "
        f"fall past the {pair.draft_host_pool.size}-row {what} host pool"
    )
    try:
        hostpool.touch_draft_rows(pair)
    except IndexError as exc:
        raise AssertionError(f"{what} host buffer indexed out of bounds: {exc}") from None


@pytest.mark.parametrize("dcp,layout", list(cases()))
def test_every_target_slot_indexes_inside_the_draft_buffer(pools, dcp, layout):
    assert_every_slot_inside(pools(dcp, layout))


@pytest.mark.parametrize("dcp,layout", list(cases()))
def test_draft_pool_is_logical_size_plus_at_most_one_page(pools, dcp, layout):
    pair = pools(dcp, layout)
    target, draft = pair.target_host_pool, pair.draft_host_pool
    assert target.logical_size <= draft.size <= target.logical_size + draft.page_size


@pytest.mark.parametrize("dcp,layout", [pytest.param(d, lay, id=f"dcp{d}-{lay}", marks=regression_at(d))
                                        for d in DCP_SIZES for lay in ("layer_first", "page_first")])
def test_a_dense_dspark_draft_host_pool_covers_every_logical_slot(dcp, layout):
    """DSPARK's drafts are dense (DSparkDraftModel): sglang gives the draft an MHATokenToKVPoolHost of its own."""
    pair = hostpool.build_pools(hostpool.Geometry(dcp, layout, draft_kind="mha"))
    assert type(pair.draft_host_pool).__name__.startswith("MHATokenToKVPoolHost")
    assert_every_slot_inside(pair, "dense draft")


@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_target_host_pool_is_unchanged(pools, dcp):
    """The fix touches the draft only: the target keeps its physical rows."""
    target = pools(dcp, "layer_first").target_host_pool
    g = hostpool.Geometry(dcp)
    assert target.size == (int(g.device_rows * g.host_ratio) // g.page_size + 1) * g.page_size
    assert target.logical_size == target.size * dcp


@pytest.mark.regression
def test_ratio_follows_logical_size_with_mock_pools():
    """Upstream's test_full_builder_sizes_sidecar_for_anchor_logical_space, for the 0.5.17 path."""
    from sglang.srt.mem_cache import kv_cache_builder
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    draft_pool = mock.MagicMock(spec=MLATokenToKVPool)
    draft_pool.size = 800
    bytes_per_token = 576 * 2  # one bf16 MLA layer; read by the pinned-memory log line (series 0004)
    controller = SimpleNamespace(
        mem_pool_host=SimpleNamespace(size=100, logical_size=800, dcp_size=8, size_per_token=bytes_per_token),
        set_draft_kv_pool=mock.MagicMock(),
    )
    with mock.patch("sglang.srt.mem_cache.pool_host.mla.MLATokenToKVPoolHost") as host_cls:
        # The rows a ratio of 1.0 builds; the capacity guard (series 0003) reads them.
        host_cls.return_value.size = 800
        host_cls.return_value.size_per_token = bytes_per_token
        kv_cache_builder.maybe_register_hicache_draft(
            tree_cache=SimpleNamespace(cache_controller=controller),
            draft_worker=SimpleNamespace(
                draft_worker=SimpleNamespace(draft_runner=SimpleNamespace(token_to_kv_pool=draft_pool))
            ),
            spec_algorithm=SimpleNamespace(is_ngram=lambda: False),
            server_args=SimpleNamespace(
                enable_multi_layer_eagle=False, hicache_mem_layout="layer_first", hicache_storage_backend=None
            ),
            enable_hierarchical_cache=True,
            page_size=64,
        )
    assert host_cls.call_args.kwargs["host_to_device_ratio"] == 1.0
    controller.set_draft_kv_pool.assert_called_once_with(draft_pool, host_cls.return_value)
