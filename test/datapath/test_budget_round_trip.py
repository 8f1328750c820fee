"""Round trip with --hicache-size set (0.5.23 trees): byte-exact, with the host pools the tree's budget gives.

On the trees that carry the draft-aware budget (patches/upstream-next 0001, or
the plugin's hooks on ``build_kv_only_stack`` and ``build_kv_only_group``) the
target host pool is shrunk so that target and draft sidecar fit the budget,
and the round trip must still come back byte for byte through the smaller
pool; on stock 0.5.23 the target takes the whole budget and the draft comes
on top of it. Either way the draft sidecar keeps one row per logical slot.
"""

from __future__ import annotations

import pytest

from emulation.datapath import matrix, scenarios
from emulation.datapath.harness import case_from
from sglang_dcp_dspark.core import rules
from sglang_dcp_dspark.plugin.hooks import common as hook_common
from trees import TREE

from .conftest import PLUGIN_TREES, plan

KV_ONLY_STACK = "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler.build_kv_only_stack"


@pytest.mark.parametrize("planned", plan("budget"))
def test_round_trip_with_hicache_size_is_byte_exact(planned):
    pools = {}

    def on_built(run):
        pools.update(target=run.target_host, draft=run.draft_host, case=run.case)

    counts = scenarios.round_trip(case_from(planned), on_built=on_built)
    assert counts.load_backs == counts.requests > 0
    assert counts.tokens_loaded == counts.tokens_checked == counts.tokens_written

    target, draft, dcp = pools["target"], pools["draft"], planned.dcp_size
    t, d = target.size_per_token, draft.size_per_token
    budget = planned.hicache_size * rules.GB
    pinned = target.size * t + draft.size * d
    page_bytes = pools["case"].page_size * (t + dcp * d)  # one physical target page and its dcp draft pages
    # What sglang alone gives the target of --hicache-size: all of it.
    alone = rules.host_pool_rows(int(budget // t), target.page_size)
    assert draft.size == target.logical_size == rules.logical_slots(target.size, dcp)
    figures = f"target {target.size} rows x {t} B + draft {draft.size} rows x {d} B = {pinned} B for a {budget:.0f} B budget"
    if matrix.budget_fits(TREE):
        assert pinned <= budget + page_bytes, f"{TREE}: --hicache-size does not hold target and draft: {figures}"
        assert target.size < alone, f"{TREE}: the target host pool was not shrunk for the draft ({alone} rows alone)"
    else:
        assert target.size == alone and pinned > budget + page_bytes, f"{TREE}: expected stock 0.5.23's budget: {figures}"
    if TREE in PLUGIN_TREES:
        # The shrink above is the plugin's: its hook on the stack is what split the budget.
        from sglang_dcp_dspark import plugin

        assert plugin.findings[KV_ONLY_STACK].verdict is hook_common.Verdict.NEEDS_FIX, plugin.findings.get(KV_ONLY_STACK)
