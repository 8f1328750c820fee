"""Run the PR #35221 parity suite against one sglang tree, named by DCP_DSPARK_TREE.

`make test` runs this directory on every tree of patches/trees.json whose
suite is upstream-pr-35221, each with PYTHONPATH on that tree (`make upstream-trees`):
- ``upstream-base``: the PR's parent, rebuilt from sglang 0.5.18 by reversing
  patches/upstream-pr-35221. Tests marked ``regression`` must fail here
  (strict xfail).
- ``upstream-0.5.18``: the stock 0.5.18 release.
The parent with the series applied again (``upstream-base-patched``) is built, but not suited: its files are
0.5.18's byte for byte (patches/trees.json's ``same_files_as``, asserted by test/project/test_tree_table.py).
Without one of these labels the directory is not collected: the default run
imports sglang 0.5.17, where neither draft path exists.
"""

from __future__ import annotations

import pytest

from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.core.compat import locate_tree
from sglang_dcp_dspark.series import patching
from tree_table import TREES, trees_testing
from trees import TREE, check_label, mark_defects
from trees import expect_fixed as _expect_fixed

SERIES = "upstream-pr-35221"
# label -> the directory the imported sglang must come from (patches/trees.json)
TREE_DIRS = {label: t.path for label, t in trees_testing(SERIES).items()}
STOCK_0_5_18 = TREES["upstream-0.5.18"].path

if TREE not in TREE_DIRS:
    collect_ignore_glob = ["test_*.py"]


def expect_fixed() -> bool:
    return _expect_fixed(TREE)


def pytest_report_header(config):
    if TREE in TREE_DIRS:
        return f"upstream-pr-35221 parity run on: {TREE} ({locate_tree(None).describe()})"


@pytest.fixture(scope="session")
def series() -> series_mod.Series:
    return series_mod.load_series(SERIES)


@pytest.fixture(scope="session")
def tree(series):
    """The sglang tree this interpreter imports, checked against the label by path and by series state."""
    found = check_label(series, TREE_DIRS[TREE])
    if expect_fixed():
        # Every patch in the tree, not a version verdict: the fix is really there.
        assert patching.inspect(found, series).applied == len(series.patches)
    return found


@pytest.fixture(scope="session", autouse=True)
def _tree_is_what_the_label_says(tree):
    return tree


def pytest_collection_modifyitems(config, items):
    if TREE in TREE_DIRS and not expect_fixed():
        mark_defects(items, "the defect is present on the PR #35221 parent")
