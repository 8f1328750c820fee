"""The series' own upstream-style test file, run with unittest on this tree.

Its fix tests fail on stock 0.5.23 and all pass patched. With the plugin on
stock 0.5.23 they pass too, except those of what the plugin does not carry:
the sharded backup (0005-0007), and the one test that calls 0008's own
helper by name.
"""

from __future__ import annotations

import pytest

from trees import run_upstream_test_file

from .conftest import PLUGIN, expect_fixed

TEST_FILE = "test/registered/unit/mem_cache/test_hicache_dcp_draft_budget.py"
# The tests that describe the change, and what stock 0.5.23 does in each: on
# stock exactly these fail, for exactly these reasons.
FIX_TESTS = {
    "TestHiCacheSizeBudget.test_target_and_dcp_draft_fit_hicache_size": "not less than or equal to",
    "TestAutoSizeDraftBytes.test_estimate_covers_the_pinned_draft_sidecar": "not less than or equal to",
    "TestDraftSidecarGuard.test_short_draft_host_pool_stops_startup": "ValueError not raised",
    "TestDraftSidecarGuard.test_pinned_host_memory_is_logged_with_the_draft_share": "AssertionError",
    # The sharded draft backup (0005-0007): stock has neither the switch nor the striped pool.
    "TestShardedDraftBackup.test_draft_host_pool_has_the_target_rows": "unknown ServerArgs field(s): ['hicache_draft_backup']",
    "TestShardedDraftBackup.test_budget_counts_one_draft_row_per_target_row": "unknown ServerArgs field(s): ['hicache_draft_backup']",
    "TestShardedDraftBackup.test_auto_size_estimate_counts_one_draft_row_per_target_row": "unknown ServerArgs field(s): ['hicache_draft_backup']",
    "TestShardedDraftBackup.test_backup_copies_only_this_ranks_stripe": "has no attribute 'DcpStripedDraftHostPool'",
    "TestShardedDraftBackup.test_load_back_all_gathers_every_stripe": "has no attribute 'DcpStripedDraftHostPool'",
    "TestShardedDraftBackup.test_unsupported_combinations_are_refused_at_argument_time": "has no attribute 'resolve_hicache_draft_backup'",
    # The speculative passes under DCP (0008) and the draft plans (0009-0010): stock admits the broken passes
    # at argument time and checks no plan. Its HiCache gate already refuses every draft but DSPARK, as 0010 expects.
    "TestDcpDraftPlans.test_passes_that_read_other_rows_are_refused_at_argument_time": "does not have the attribute 'use_mla_backend'",
    "TestDcpDraftPlans.test_a_replicated_draft_is_not_packed_under_dcp": "NotImplementedError not raised",
    # 0013: an external MLA draft checkpoint is told by its config (stock has no such question to ask).
    "TestDcpDraftPlans.test_an_mla_draft_checkpoint_is_told_by_its_config": "has no attribute '_draft_uses_mla'",
    "TestDcpDraftPlans.test_an_eagle_draft_sidecar_is_refused_under_dcp": "NotImplementedError not raised",
    # 0020: the HiCache gate under DCP decides an EAGLE-family draft by its layout (stock's imports nothing it reads),
    # and the plan check a dense draft's by its backends.
    "TestDcpDraftPlans.test_the_hicache_gate_admits_the_drafts_whose_host_pool_fits": "does not have the attribute 'attention_backends_of'",
    "TestDcpDraftPlans.test_the_hicache_gate_refuses_a_striped_draft_in_a_sidecar": "does not have the attribute 'attention_backends_of'",
    "TestDcpDraftPlans.test_a_dense_draft_sidecar_fits_where_its_backend_replicates_it": "does not have the attribute 'get_spec'",
    "TestDcpDraftPlans.test_the_sharded_backup_refuses_a_packed_draft": "unknown ServerArgs field(s): ['hicache_draft_backup']",
    "TestDcpDraftPlans.test_the_sharded_backup_refuses_the_fused_plan_at_argument_time": "has no attribute 'resolve_hicache_draft_backup'",
}
TESTS_IN_FILE = 24
# With the plugin: the sharded backup, which only the series carries. 0008's check is the plugin's, put in
# sglang's module under 0008's name (hooks/speculative_hook.declare_check), so the series' test of it passes too.
PLUGIN_DOES_NOT_CARRY = {name for name in FIX_TESTS if name.startswith("TestShardedDraftBackup.")} | {
    # 0020's plan-check helper, called by name: the plugin's own (hooks/hybrid_pool_assembler.striped_sidecar) is
    # tested in test/plugin/test_hicache_gate.py.
    "TestDcpDraftPlans.test_a_dense_draft_sidecar_fits_where_its_backend_replicates_it",
    "TestDcpDraftPlans.test_the_sharded_backup_refuses_a_packed_draft",
    "TestDcpDraftPlans.test_the_sharded_backup_refuses_the_fused_plan_at_argument_time",
}


@pytest.fixture(scope="module")
def upstream_result(series, tmp_path_factory):
    return run_upstream_test_file(series, TEST_FILE, tmp_path_factory.mktemp("upstream-next-test"))


def short_id(test) -> str:
    # A failing subTest reports as "<test id> (dcp_size=N)"; count it once, under its test.
    return ".".join(test.id().split(" ")[0].split(".")[-2:])


def test_it_ran_every_test(upstream_result):
    assert upstream_result.testsRun == TESTS_IN_FILE


def test_exactly_the_fix_tests_fail_on_stock_and_none_patched(upstream_result):
    failed: dict[str, str] = {}
    for test, text in upstream_result.failures + upstream_result.errors:
        failed.setdefault(short_id(test), text)
    stock = [] if expect_fixed() else sorted(FIX_TESTS)
    want = sorted(PLUGIN_DOES_NOT_CARRY) if PLUGIN else stock
    assert sorted(failed) == want
    for name, text in failed.items():
        assert FIX_TESTS[name] in text, f"{name} failed for another reason:\n{text}"
