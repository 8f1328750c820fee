"""upstream-next 0014's test file (the split verify plan under DCP), run with unittest on this tree.

It imports ``plan_dcp_split_verify`` from ``sglang.srt.layers.dcp.split_verify``, the module 0012 adds: on the
patched tree its six tests pass (four of 0014's, two of 0019's for the NextN draft extend) (the merge kernel's where Triton can run it: a GPU, or
Triton's interpreter, else skipped); stock 0.5.23 has no such module, and neither has the plugin's tree (the plugin
carries the fix as hooks on the flashinfer MLA backend, test/numerics), so there the file does not import.
"""

from __future__ import annotations

import pytest

from trees import TREE, run_upstream_test_file

VERIFY_FILE = "test/registered/unit/layers/test_dcp_split_verify.py"
SERIES_TREES = ("next-patched",)


def test_the_verify_plan_tests_pass_where_the_series_carries_the_planner(series, tmp_path):
    if TREE not in SERIES_TREES:
        with pytest.raises(ImportError, match="split_verify"):
            run_upstream_test_file(series, VERIFY_FILE, tmp_path)
        return
    result = run_upstream_test_file(series, VERIFY_FILE, tmp_path)
    assert result.testsRun == 6
    assert not result.failures and not result.errors, result.failures + result.errors
