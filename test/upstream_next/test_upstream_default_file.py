"""upstream-next 0016's test file (the MLA backend default under DCP on Hopper), run with unittest on this tree.

On the patched tree its three tests pass. On stock 0.5.23, and with the plugin (which carries the change as a hook
on ``arg_groups.overrides``, not in ``model_override_base``, where the file calls sglang's picker directly), the test
of the DCP default fails and the other two pass: the file can fail, and fails on what 0015 changes.
"""

from __future__ import annotations

from trees import TREE, run_upstream_test_file

DEFAULT_FILE = "test/registered/unit/server_args/test_dcp_mla_default_backend.py"
SERIES_TREES = ("next-patched",)


def test_the_default_backend_tests_pass_where_the_series_carries_the_default(series, tmp_path):
    result = run_upstream_test_file(series, DEFAULT_FILE, tmp_path)
    assert result.testsRun == 3, result.testsRun
    # A subtest's failure is reported for its test case.
    failed = sorted({getattr(test, "test_case", test)._testMethodName for test, _ in result.failures + result.errors})
    if TREE in SERIES_TREES:
        assert not failed, result.failures + result.errors
    else:
        assert failed == ["test_hopper_mla_under_dcp_defaults_to_flashinfer"], result.failures + result.errors
