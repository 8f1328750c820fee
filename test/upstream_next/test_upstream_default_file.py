"""upstream-next 0016's test file (the MLA backend default under DCP on Hopper), run with unittest on this tree.

On the patched tree its three tests pass, and so they do on stock 0.5.23 with the plugin: its hook on
``arg_groups.overrides.get_default_attn_backend`` is registered through sglang's HookRegistry, which puts the wrapped
picker in every module that imported it by name (``model_override_base``, where the file calls it, among them). On
stock 0.5.23 alone the test of the DCP default fails and the other two pass: the file can fail, and fails on what
0015 changes.
"""

from __future__ import annotations

from trees import TREE, run_upstream_test_file

DEFAULT_FILE = "test/registered/unit/server_args/test_dcp_mla_default_backend.py"
DEFAULT_TREES = ("next-patched", "next-plugin")  # the series carries the default; the plugin's hook does


def test_the_default_backend_tests_pass_where_the_series_carries_the_default(series, tmp_path):
    result = run_upstream_test_file(series, DEFAULT_FILE, tmp_path)
    assert result.testsRun == 3, result.testsRun
    # A subtest's failure is reported for its test case.
    failed = sorted({getattr(test, "test_case", test)._testMethodName for test, _ in result.failures + result.errors})
    if TREE in DEFAULT_TREES:
        assert not failed, result.failures + result.errors
    else:
        assert failed == ["test_hopper_mla_under_dcp_defaults_to_flashinfer"], result.failures + result.errors
