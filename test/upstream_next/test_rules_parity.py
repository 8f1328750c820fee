"""upstream-next splits --hicache-size as the rule module does without the page hold-back, on sglang 0.5.23's own pools.

On ``next-plugin`` the split is the plugin's (its hook on
``build_kv_only_stack`` gives the target the same share as 0001, by
``rules.sidecar_target_hicache_size``), so the same assertions hold there.

The one difference is upstream's rounding, asserted here exactly: patch 0001
gives the target t / (t + dcp_size * d) of the budget and holds nothing back
for sglang's page rounding, so its target gets
``rules.BudgetSplit(..., hold_back_rounding=False).target_rows`` rows (before
sglang rounds the pool up past its last page), where the plugin and series
patch 0004 give ``hold_back_rounding=True``'s rows, one target page and two
draft pages' worth fewer.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest

from emulation import rank_pools as P
from sglang_dcp_dspark.core import rules
from sglang_dcp_dspark.plugin.hooks import common as hook_common

BUDGETS_GB = (0.05, 1.0, 100.0)
# The geometry of the 0.5.17 parity test (test/regression/test_rules_parity.py): the same pools.
SAME_POOLS = dict(device_rows=1024, target_layers=2, draft_layers=1)


def _the_split():
    """(module, name) of the function that gives the target its share of --hicache-size here; None on stock 0.5.23.

    The series' ``_target_hicache_size`` (patch 0001), or on a plugin tree the
    plugin's ``target_hicache_size``, which its hook on ``build_kv_only_stack``
    calls with the same arguments (only where the plugin hooked that function).
    """
    from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as assembler

    if hasattr(assembler, "_target_hicache_size"):
        return assembler, "_target_hicache_size"
    from sglang_dcp_dspark import plugin

    finding = plugin.findings.get("sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler.build_kv_only_stack")
    if finding is not None and finding.verdict is hook_common.Verdict.NEEDS_FIX:
        from sglang_dcp_dspark.plugin.hooks import hybrid_pool_assembler as carrier

        return carrier, "target_hicache_size"
    return None


def build_and_record(dcp: int, budget_gb: float):
    """Build the pools; return them, the GB share upstream's split gave the target, and the rule's splits."""
    # Stock 0.5.23 has no split at all: nothing is recorded, and the test fails on its assertion.
    where = _the_split()
    given = []

    def record(*args, **kwargs):
        given.append(split_by_upstream(*args, **kwargs))
        return given[-1]

    rank = P.Rank(dcp, hicache_size=budget_gb, **SAME_POOLS)
    if where is None:
        recording = contextlib.nullcontext()
    else:
        split_by_upstream = getattr(*where)
        recording = mock.patch.object(*where, record)
    with P.on_rank(rank), recording:
        pools = P.build(rank)
    t, d = pools.target_host.size_per_token, pools.draft_host.size_per_token
    budget = int(budget_gb * rules.GB)
    bare = rules.BudgetSplit(budget, t, d, dcp, P.PAGE_SIZE, hold_back_rounding=False)
    held = rules.BudgetSplit(budget, t, d, dcp, P.PAGE_SIZE)
    return pools, given, bare, held, budget, t, d


@pytest.mark.regression
@pytest.mark.parametrize("budget_gb", BUDGETS_GB)
@pytest.mark.parametrize("dcp", [1, 2, 8])
def test_upstream_next_gives_the_rule_modules_rows_without_the_hold_back(dcp, budget_gb):
    pools, given, bare, held, budget, t, d = build_and_record(dcp, budget_gb)
    assert len(given) == 1 and given[0] is not None, f"upstream-next did not split --hicache-size: {given}"
    # The same share of the budget (upstream computes it in float GB from device bytes per token)...
    assert given[0] == pytest.approx(budget_gb * bare.target_share, rel=1e-12)
    # ...and exactly the rule's rows, once sglang floors the GB back into rows.
    asked = int(given[0] * rules.GB // pools.target_host.size_per_token)
    assert asked == bare.target_rows
    assert pools.target_host.size == rules.host_pool_rows(bare.target_rows, P.PAGE_SIZE)
    assert pools.draft_host.size == rules.logical_slots(pools.target_host.size, dcp)
    # The documented difference: 0004 and the plugin split the budget less one target page and two draft
    # pages, which upstream-next spends (and so pins up to that much past --hicache-size).
    assert held.rounding_bytes == P.PAGE_SIZE * (held.target_bytes_per_token + 2 * dcp * held.draft_bytes_per_token)
    less_rounding = rules.BudgetSplit(budget - held.rounding_bytes, t, d, dcp, P.PAGE_SIZE, hold_back_rounding=False)
    assert held.target_rows == less_rounding.target_rows < bare.target_rows
