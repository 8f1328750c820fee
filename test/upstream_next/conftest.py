"""Run the upstream-next suite against one sglang 0.5.23 tree, named by DCP_DSPARK_TREE.

`make test` runs this directory on every tree of patches/trees.json whose
suite is upstream-next, with PYTHONPATH on that tree (`make next-trees`):
- ``next-stock``: sglang 0.5.23 as released. Tests marked ``regression``
  describe the draft-aware budget and the guard, so here they must fail with an
  AssertionError (strict xfail).
- ``next-patched``: a copy with patches/upstream-next applied.
Without one of these labels the directory is not collected: the default run
imports sglang 0.5.17, which has no draft sidecar.
"""

from __future__ import annotations

import pytest

from sglang_dcp_dspark import series as series_mod
from sglang_dcp_dspark.compat import locate_tree
from tree_table import trees_testing
from trees import TREE, check_label, expected_state, mark_defects
from trees import expect_fixed as _expect_fixed

SERIES = "upstream-next"
# label -> (the directory the imported sglang must come from, the state the series must be in there),
# both from patches/trees.json
TREE_DIRS = {
    label: (t.path, expected_state(label, SERIES)) for label, t in trees_testing(SERIES).items()
}

if TREE not in TREE_DIRS:
    collect_ignore_glob = ["test_*.py"]


def expect_fixed() -> bool:
    return _expect_fixed(TREE)


def pytest_report_header(config):
    if TREE in TREE_DIRS:
        return f"upstream-next run on: {TREE} ({locate_tree(None).describe()})"


@pytest.fixture(scope="session")
def series() -> series_mod.Series:
    return series_mod.load_series(SERIES)


@pytest.fixture(scope="session", autouse=True)
def tree(series):
    """The sglang tree this interpreter imports, checked against the label by path and by series state."""
    want_dir, _ = TREE_DIRS[TREE]
    return check_label(series, want_dir)


def pytest_collection_modifyitems(config, items):
    if TREE in TREE_DIRS and not expect_fixed():
        mark_defects(items, "stock sglang 0.5.23 leaves the draft sidecar out of the HiCache budget and has no guard")
