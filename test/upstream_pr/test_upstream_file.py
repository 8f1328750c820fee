"""The series' own upstream-style test file, run with unittest on this tree: fails on the parent, passes fixed."""

from __future__ import annotations

import pytest

from trees import run_upstream_test_file

from .conftest import expect_fixed

TEST_FILE = "test/registered/unit/mem_cache/test_dcp_dspark_draft_sizing.py"
# The tests that describe the fix, and what the parent's code does in each:
# on the parent exactly these fail, for exactly these reasons.
FIX_TESTS = {
    "TestFullDraftSidecarSizing.test_sidecar_covers_anchor_logical_space": "AssertionError: 0.125 != 1.0",
    "TestLegacyDraftSizing.test_legacy_covers_primary_logical_space": "AssertionError: 0.125 != 1.0",
    "TestHiCacheDcpSpeculativeGate.test_dspark_is_admitted": "does not support speculative decoding yet",
}


@pytest.fixture(scope="module")
def upstream_result(series, tmp_path_factory):
    return run_upstream_test_file(series, TEST_FILE, tmp_path_factory.mktemp("upstream-test"))


def short_id(test) -> str:
    return ".".join(test.id().split(".")[-2:])


def test_it_ran_every_test(upstream_result):
    assert upstream_result.testsRun == 9


def test_exactly_the_fix_tests_fail_on_the_parent_and_none_when_fixed(upstream_result):
    # CustomTestCase re-raises a failure as an error that chains the original.
    failed = {short_id(t): text for t, text in upstream_result.failures + upstream_result.errors}
    assert sorted(failed) == ([] if expect_fixed() else sorted(FIX_TESTS))
    for name, why in failed.items():
        assert FIX_TESTS[name] in why, f"{name} failed for another reason:\n{why}"
