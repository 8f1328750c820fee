"""Draft-aware HiCache budget, auto-size estimate and draft sidecar guard, on sglang 0.5.23's own pools at full scale."""

from __future__ import annotations

from unittest import mock

import pytest

from emulation import rank_pools as P
from sglang_dcp_dspark.core import budget
from trees import TREE

from .conftest import series_only

DCP_SIZES = (1, 2, 8)
# Issue #5's example: a DeepSeek-V3-like target (61 MLA layers) whose host pool
# holds 1M physical rows per rank (500k device rows at --hicache-ratio 2), and
# a one-layer bf16 MLA draft, 1,152 bytes per token.
FULL_SCALE = dict(device_rows=500_000, target_layers=61, draft_layers=1)
HICACHE_SIZE_GB = 100


def build(dcp: int, **kw) -> P.Pools:
    rank = P.Rank(dcp, **{**FULL_SCALE, **kw})
    with P.on_rank(rank):
        return P.build(rank)


@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_the_draft_sidecar_holds_every_logical_slot(dcp):
    """What 0.5.23 already does (PR #35221 plus host_token_capacity): one draft row per logical slot."""
    pools = build(dcp)
    assert pools.draft_host.size == pools.target_host.logical_size == pools.target_host.size * dcp


def test_issue_example_costs_dcp_size_times_the_draft_rows():
    """DCP8: 1M target rows bring 8M draft rows, about 9.2 GB pinned per rank where dcp 1 pins 1.15 GB."""
    one, eight = build(1), build(8)
    assert one.target_host.size == eight.target_host.size == 1_000_064
    assert (one.draft_host.size, eight.draft_host.size) == (1_000_064, 8_000_512)
    assert eight.draft_host.size_per_token == 1152
    assert round(one.draft_bytes / 1e9, 2) == 1.15
    assert round(eight.draft_bytes / 1e9, 2) == 9.22


@pytest.mark.regression
@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_hicache_size_holds_target_and_draft(dcp):
    pools = build(dcp, hicache_size=HICACHE_SIZE_GB)
    budget = HICACHE_SIZE_GB * 1e9
    # One padding page past the budget, as for a target-only pool.
    assert pools.pinned_bytes <= budget + pools.page_bytes, (
        f"dcp {dcp}: --hicache-size {HICACHE_SIZE_GB} pins {pools.pinned_bytes / 1e9:.2f} GB "
        f"(target {pools.target_bytes / 1e9:.2f} + draft {pools.draft_bytes / 1e9:.2f})"
    )
    assert pools.draft_host.size == pools.target_host.logical_size


@pytest.mark.skipif(TREE == "next-patched", reason="plugin-only: upstream-next 0001 has no switch (upstream has "
                                                      "no precedent for one); preflight turns its split off itself")
def test_opt_out_restores_the_target_only_budget():
    """SGLANG_HICACHE_SIZE_EXCLUDES_DRAFT=1 gives the target the whole budget, as stock 0.5.23 does (the plugin's
    switch; stock has the whole budget anyway)."""
    with mock.patch.dict("os.environ", {"SGLANG_HICACHE_SIZE_EXCLUDES_DRAFT": "1"}):
        pools = build(8, hicache_size=HICACHE_SIZE_GB)
    assert pools.target_bytes == pytest.approx(HICACHE_SIZE_GB * 1e9, abs=pools.page_bytes)


def test_preflight_prices_sglangs_own_sizing_on_every_tree():
    """What preflight builds as sglang's own sizing (``budget.unbudgeted_sizing``) gives the target the whole
    budget whichever carrier splits it: the plugin's switch, or upstream-next 0001's split turned off."""
    with budget.unbudgeted_sizing():
        pools = build(8, hicache_size=HICACHE_SIZE_GB)
    assert pools.target_bytes == pytest.approx(HICACHE_SIZE_GB * 1e9, abs=pools.page_bytes)
    split = build(8, hicache_size=HICACHE_SIZE_GB)
    if TREE != "next-stock":  # the control: outside the block the carrier splits it
        assert split.target_bytes < 0.9 * pools.target_bytes


@pytest.mark.parametrize("dcp", DCP_SIZES)
def test_ratio_sizing_ignores_the_draft(dcp):
    pools = build(dcp, hicache_ratio=2.0)
    assert pools.target_host.size == 1_000_064


@pytest.mark.parametrize("dcp", [pytest.param(d, marks=[pytest.mark.regression] if d > 1 else []) for d in DCP_SIZES])
def test_auto_size_estimate_covers_what_is_pinned(dcp):
    """Auto-sizing picks the ratio so that estimate x ratio fits the host budget; the pools must not pin more."""
    rank = P.Rank(dcp, **FULL_SCALE, hicache_ratio=2.0)
    with P.on_rank(rank):
        pools = P.build(rank)
        estimate = P.auto_size_estimate(pools)
    assert pools.pinned_bytes <= estimate * rank.hicache_ratio, (
        f"dcp {dcp}: estimate x ratio {estimate * rank.hicache_ratio / 1e9:.2f} GB, "
        f"pinned {pools.pinned_bytes / 1e9:.2f} GB"
    )


def _startup_error(build_rank, resize) -> str | None:
    """What ``build_rank()`` raises when ``resize`` rewrites the draft host pool's sizing arguments; None if it builds."""
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as assembler

    build_host_pool = assembler._build_mha_mla_host_pool

    def resized(**kwargs):
        if kwargs.get("pool_label") == "draft":
            resize(kwargs)
        return build_host_pool(**kwargs)

    with mock.patch.object(assembler, "_build_mha_mla_host_pool", resized):
        try:
            build_rank()
        except ValueError as exc:
            return str(exc)
    return None


@pytest.mark.regression
def test_a_short_draft_sidecar_stops_startup_with_one_line():
    def physical_rows(kwargs):
        # The sizing of releases before PR #35221: one draft row per physical target row.
        kwargs["host_token_capacity"] = None
        kwargs["host_to_device_ratio"] /= 8

    error = _startup_error(lambda: build(8), physical_rows)
    assert error is not None, "a draft sidecar with physical rows was accepted"
    assert "\n" not in error
    assert "8000512 logical slots (1000064 rows x dcp_size 8)" in error
    assert "host pool has 1000448 rows" in error
    assert "--enable-hierarchical-cache" in error


def test_a_host_budget_short_of_the_draft_fails_at_startup():
    """What 0.5.23 already does: each host pool is checked against the budget as it is allocated."""
    fits = build(8)
    with pytest.raises(ValueError, match="Not enough host memory"):
        build(8, host_memory=fits.target_bytes)


# --hicache-draft-backup sharded (patches 0005-0007): one DCP stripe of the draft per rank.
SHARDED = series_only("--hicache-draft-backup sharded is patches/upstream-next 0005-0007, which the plugin does not carry")


def _sharded(dcp: int, **kw) -> P.Pools:
    import importlib.util

    # On stock 0.5.23 the switch does not exist: say so as the AssertionError a regression xfail expects.
    assert importlib.util.find_spec("sglang.srt.mem_cache.pool_host.dcp_draft"), "no --hicache-draft-backup here"
    return build(dcp, draft_backup="sharded", **kw)


@SHARDED
@pytest.mark.regression
@pytest.mark.parametrize("dcp", [2, 8])
def test_a_sharded_draft_sidecar_has_the_target_rows(dcp):
    """The issue example sharded: at DCP8 the draft pins 1/8 of the 9.22 GB per rank, the rows of its stripe."""
    replicated, sharded = build(dcp), _sharded(dcp)
    assert sharded.target_host.size == replicated.target_host.size == 1_000_064
    assert sharded.draft_host.size == sharded.target_host.size
    assert sharded.draft_host.logical_size == sharded.target_host.logical_size
    assert sharded.draft_bytes * dcp == replicated.draft_bytes


@SHARDED
@pytest.mark.regression
def test_sharded_hicache_size_gives_the_draft_share_back_to_the_target():
    replicated, sharded = build(8, hicache_size=HICACHE_SIZE_GB), _sharded(8, hicache_size=HICACHE_SIZE_GB)
    assert sharded.pinned_bytes <= HICACHE_SIZE_GB * 1e9 + sharded.page_bytes
    assert sharded.target_host.size > replicated.target_host.size
    # The split is t / (t + d) whatever dcp is: what dcp 1 gets.
    assert sharded.target_host.size == build(1, hicache_size=HICACHE_SIZE_GB).target_host.size


@SHARDED
@pytest.mark.regression
def test_a_short_sharded_draft_stops_startup_with_one_line():
    def half_stripe(kwargs):
        kwargs["host_token_capacity"] //= 2

    error = _startup_error(lambda: _sharded(8), half_stripe)
    assert error is not None, "a draft stripe with half the target's rows was accepted"
    assert "\n" not in error
    assert "has 500032 rows per DCP stripe but the target host pool has 1000064 rows" in error
    assert "--hicache-draft-backup replicated" in error
