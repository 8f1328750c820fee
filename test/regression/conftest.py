"""Run the regression suite against one sglang tree, named by DCP_DSPARK_TREE.

`make test` runs this directory on every tree of patches/trees.json whose
suite is sglang-0.5.17; today:
- ``stock`` (default): the installed sglang 0.5.17. Tests marked
  ``regression`` describe the fixed behaviour, so here they must fail with an
  AssertionError; they are strict xfails, and one that passes fails the run.
- ``patched``: PYTHONPATH points at a copy with the 0.5.17 series applied.
- ``plugin``: the stock tree, with sglang's load_plugins() run first, so the
  installed dcp_dspark plugin hooks it at run time.
Unmarked tests are invariants that must hold on every tree.
"""

from __future__ import annotations

import pytest

from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.core.compat import locate_tree
from sglang_dcp_dspark.series import patching
from tree_table import trees_testing
from trees import TREE, expected_state, mark_defects
from trees import expect_fixed as _expect_fixed

BACKPORT = "sglang-0.5.17"
# The state the 0.5.17 series must be in on the imported tree for each label
# that runs this directory (patches/trees.json); a mismatch means the run is
# not testing what it claims to. "plugin" is the stock tree, fixed at run time.
EXPECTED_SERIES_STATE = {
    label: expected_state(label, BACKPORT) for label in trees_testing(BACKPORT)
}


def expect_fixed() -> bool:
    return _expect_fixed(TREE)


def pytest_report_header(config):
    return f"sglang tree under test: {TREE} ({locate_tree(None).describe()})"


@pytest.fixture(scope="session", autouse=True)
def _tree_is_what_the_label_says():
    want = EXPECTED_SERIES_STATE.get(TREE)
    if want is None:
        return
    tree = locate_tree(None)
    got = patching.inspect(tree, series_mod.load_series(BACKPORT)).state
    assert got is want, f"DCP_DSPARK_TREE={TREE} but {tree.describe()} reads as {got.value}"


@pytest.fixture(scope="session", autouse=True)
def _plugin_loaded():
    if TREE == "plugin":
        # As sglang's schedulers do: kv_cache_builder is imported, then
        # load_plugins() finds the plugin through its installed entry point;
        # nothing of sglang is edited.
        from sglang.srt.mem_cache import kv_cache_builder  # noqa: F401
        from sglang.srt.plugins import load_plugins

        load_plugins()


def pytest_collection_modifyitems(config, items):
    if not expect_fixed():
        mark_defects(items, "the defect is present on stock sglang 0.5.17")
