"""upstream-next 0011's test file (DCP refused on fa3 MLA, whatever the speculative algorithm), run on this tree.

Its two tests pass on the patched tree, and on stock 0.5.23 with the plugin, which puts its own check in sglang's
module under 0011's name (``hooks/speculative_hook.declare_check``), reading the helpers the file patches there.
On stock 0.5.23 alone both fail: it has no such check. The file fails on the unfixed 0011 too (its first version
returned early for any speculative algorithm): the NGRAM, STANDALONE and DFLASH subtests.
"""

from __future__ import annotations

from trees import TREE, run_upstream_test_file

FA3_FILE = "test/registered/unit/server_args/test_dcp_fa3_mla.py"
FIXED_TREES = ("next-patched", "next-plugin")


def test_the_fa3_tests_pass_where_the_series_or_the_plugin_refuses_fa3(series, tmp_path):
    result = run_upstream_test_file(series, FA3_FILE, tmp_path)
    assert result.testsRun == 2, result.testsRun
    failed = sorted({getattr(test, "test_case", test)._testMethodName for test, _ in result.failures + result.errors})
    if TREE in FIXED_TREES:
        assert not failed, result.failures + result.errors
    else:
        assert failed == ["test_fa3_mla_is_refused_with_or_without_speculative_decoding",
                          "test_other_launches_are_left_alone"], result.failures + result.errors
