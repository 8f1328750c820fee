"""Series patch 0004 and the plugin split --hicache-size exactly as the rule module does, on sglang's own pools."""

from __future__ import annotations

import pytest

import hostpool
from sglang_dcp_dspark.core import rules
from sglang_dcp_dspark.core.sizing import host_bytes_per_token

BUDGETS_GB = (0.05, 1.0, 100.0)  # the last one only sizes: no host pool is built at it


def split_by_the_tree(dcp: int, budget_gb: float):
    """sglang's own Scheduler.init_memory_pools (patch 0004, or the plugin's hook) on real device pools."""
    from sglang.srt.managers.scheduler import Scheduler

    g = hostpool.Geometry(dcp, hicache_size_gb=budget_gb)
    scheduler = hostpool.scheduler_stand_in(g)
    Scheduler.init_memory_pools(scheduler)
    target = scheduler.tp_worker.model_runner.token_to_kv_pool
    draft = scheduler.draft_worker.draft_worker.draft_runner.token_to_kv_pool
    expected = rules.BudgetSplit(
        int(budget_gb * rules.GB), host_bytes_per_token(target), host_bytes_per_token(draft), dcp, target.page_size
    )
    return scheduler.server_args.hicache_size, expected


@pytest.mark.regression
@pytest.mark.parametrize("budget_gb", BUDGETS_GB)
@pytest.mark.parametrize("dcp", [1, 2, 4, 8])
def test_the_target_share_is_the_rule_modules_exactly(dcp, budget_gb):
    got, expected = split_by_the_tree(dcp, budget_gb)
    # Exact float equality: the same integer rows times the same bytes per token, over 1e9.
    assert got == expected.target_hicache_size_gb, (
        f"dcp {dcp}, --hicache-size {budget_gb}: the tree gives the target {got!r} GB, the rule "
        f"{expected.target_hicache_size_gb!r} GB ({expected.target_rows} rows)"
    )


@pytest.mark.regression
@pytest.mark.parametrize("dcp", [1, 2, 4, 8])
def test_the_pools_built_from_it_are_the_rule_modules_rows(dcp):
    """What HiCache then pins: the target's rows from the split, the draft one row per logical slot, inside the budget."""
    budget_gb = BUDGETS_GB[0]
    pair, args = hostpool.start_hicache(hostpool.Geometry(dcp, hicache_size_gb=budget_gb))
    _, expected = split_by_the_tree(dcp, budget_gb)
    target, draft = pair.target_host_pool, pair.draft_host_pool
    # sglang floors hicache_size * 1e9 / bytes per token, then rounds up past the last page.
    asked = int(args.hicache_size * rules.GB // target.size_per_token)
    assert asked == expected.target_rows
    assert target.size == rules.host_pool_rows(asked, target.page_size)
    assert rules.covers(draft.size, rules.logical_slots(target.size, dcp))
    assert target.size * target.size_per_token + draft.size * draft.size_per_token <= expected.budget_bytes
