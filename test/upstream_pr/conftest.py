"""Run the PR #35221 parity suite against one sglang tree, named by DCP_DSPARK_TREE.

`make test` runs this directory three times, each with PYTHONPATH on one tree
built under build/trees by `make upstream-trees`:
- ``upstream-base``: the PR's parent, rebuilt from sglang 0.5.18 by reversing
  patches/upstream-pr-35221. Tests marked ``regression`` must fail here
  (strict xfail).
- ``upstream-base-patched``: that parent with the series applied again.
- ``upstream-0.5.18``: the stock 0.5.18 release.
Without one of these labels the directory is not collected: the default run
imports sglang 0.5.17, where neither draft path exists.
"""

from __future__ import annotations

import pytest
from trees import BUILD_TREES as TREES
from trees import TREE, imported_tree, mark_defects

from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.compat import locate_tree

SERIES = "upstream-pr-35221"
# label -> the directory the imported sglang must come from
TREE_DIRS = {
    "upstream-base": TREES / f"{SERIES}-base",
    "upstream-base-patched": TREES / f"{SERIES}-base-patched",
    "upstream-0.5.18": TREES / "sglang-0.5.18",
}
STOCK_0_5_18 = TREE_DIRS["upstream-0.5.18"]

if TREE not in TREE_DIRS:
    collect_ignore_glob = ["test_*.py"]


def expect_fixed() -> bool:
    return TREE != "upstream-base"


def pytest_report_header(config):
    if TREE in TREE_DIRS:
        return f"upstream-pr-35221 parity run on: {TREE} ({locate_tree(None).describe()})"


@pytest.fixture(scope="session")
def series() -> series_mod.Series:
    return series_mod.load_series(SERIES)


@pytest.fixture(scope="session")
def tree(series):
    """The sglang tree this interpreter imports, checked against the label by path and by series state."""
    found = imported_tree(TREE_DIRS[TREE])
    status = series_mod.inspect(found, series)
    if expect_fixed():
        assert status.state is series_mod.State.FIXED_UPSTREAM and status.applied == len(series.patches), status.line()
    else:
        assert status.state is series_mod.State.APPLICABLE, status.line()
    return found


@pytest.fixture(scope="session", autouse=True)
def _tree_is_what_the_label_says(tree):
    return tree


def pytest_collection_modifyitems(config, items):
    if TREE in TREE_DIRS and not expect_fixed():
        mark_defects(items, "the defect is present on the PR #35221 parent")
